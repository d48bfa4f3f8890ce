"""Accuracy of Intel Neural Compressor FP8 against bf16, through lm-evaluation-
harness's ``vllm`` model type on the local task ``simple_facts``
(tests/data/lm_eval), offline.

Calibrates the model with ``python -m vllm_hpu.calibrate`` over the local prompts
(or reuses ``--calibration`` when it holds a QUANTIZE config), then evaluates bf16
and FP8 (``quantization="inc"``, ``kv_cache_dtype="fp8_inc"``, ``QUANT_CONFIG``
set) each in a child process (the plugin reads its variables once per process),
and prints the scores and the drop in points.

Run from the repository root (the task's data path is relative to it):
    PYTHONPATH=$PWD python -m benchmarks.inc_accuracy
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_MODEL = ".cache/models/smollm2-135m-instruct"
TASK = "simple_facts"
TASK_DIR = "tests/data/lm_eval"
CALIBRATION_PROMPTS = "tests/data/inc_calibration.jsonl"
METRICS = ("acc", "acc_norm")
MAX_DROP = 2.0  # points
RESULT = "inc-accuracy-result: "


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument(
        "--calibration",
        type=Path,
        help="folder of a previous calibration to reuse, or to calibrate into "
        "(default: a temporary folder)",
    )
    parser.add_argument(
        "--blocklist",
        nargs="*",
        default=["lm_head"],
        help="modules left in bf16 (default: lm_head; none: everything in fp8)",
    )
    parser.add_argument("--max-model-len", type=int, default=256)
    parser.add_argument("--limit", type=int, help="first N items only")
    parser.add_argument("--child", choices=["bf16", "fp8"], help=argparse.SUPPRESS)
    return parser.parse_args()


def evaluate(args: argparse.Namespace) -> dict[str, float]:
    """In the child: lm-eval's vllm model on the local task; the task's metrics."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    model_args = {
        "pretrained": args.model,
        "dtype": "bfloat16",
        "max_model_len": args.max_model_len,
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 32,
        "seed": 0,
    }
    if args.child == "fp8":
        model_args |= {"quantization": "inc", "kv_cache_dtype": "fp8_inc"}
    results = lm_eval.simple_evaluate(
        model="vllm",
        model_args=model_args,
        tasks=[TASK],
        task_manager=TaskManager(include_path=TASK_DIR, include_defaults=False),
        batch_size="auto",
        limit=args.limit,
    )
    scores = results["results"][TASK]
    return {metric: scores[f"{metric},none"] for metric in METRICS}


def run_child(args: argparse.Namespace, kind: str, quant_config: Path) -> dict:
    """One engine in a child process; its scores and wall time."""
    env = dict(
        os.environ,
        VLLM_HPU_EMULATION=os.environ.get("VLLM_HPU_EMULATION", "1"),
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
    )
    env.pop("QUANT_CONFIG", None)
    if kind == "fp8":
        env["QUANT_CONFIG"] = str(quant_config)
    command = [sys.executable, "-m", "benchmarks.inc_accuracy", "--child", kind]
    started = time.perf_counter()
    done = subprocess.run(
        [*command, *sys.argv[1:]], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(done.stderr[-4000:])
    # vLLM logs to stdout as well, also after the result line.
    (line,) = [x for x in done.stdout.splitlines() if x.startswith(RESULT)]
    return {
        **json.loads(line.removeprefix(RESULT)),
        "seconds": time.perf_counter() - started,
    }


def calibrated(args: argparse.Namespace) -> Path:
    """The QUANTIZE config: reused from ``--calibration``, or measured now."""
    from vllm_hpu import calibrate

    output = args.calibration or Path(tempfile.mkdtemp(prefix="inc-accuracy-"))
    quant_config = output / calibrate.QUANT_CONFIG
    if quant_config.exists():
        print(f"Reusing the calibration in {output}")
        return quant_config
    started = time.perf_counter()
    calibrate.main(
        [
            args.model,
            f"--dataset={CALIBRATION_PROMPTS}",
            f"--output={output}",
            f"--max-model-len={args.max_model_len}",
            f"--max-num-batched-tokens={args.max_model_len}",
            *(f"--blocklist={name}" for name in args.blocklist),
        ]
    )
    print(f"Calibrated in {time.perf_counter() - started:.0f} s into {output}")
    return quant_config


def report(bf16: dict, fp8: dict, blocklist: list[str]) -> None:
    """The table: scores in percent, drop in points, within MAX_DROP or not."""
    kept = ", ".join(blocklist) or "none"
    print(f"\nFP8 (INC maxabs_hw, fp8_inc KV cache, kept in bf16: {kept}) vs bf16")
    print(f"{'task':<14}{'metric':<10}{'bf16':>7}{'fp8':>7}{'drop':>7}  within")
    for metric in METRICS:
        want, got = 100 * bf16[metric], 100 * fp8[metric]
        drop = want - got
        within = "yes" if drop <= MAX_DROP else "NO"
        print(f"{TASK:<14}{metric:<10}{want:>7.1f}{got:>7.1f}{drop:>7.1f}  {within}")
    seconds = f"bf16 {bf16['seconds']:.0f} s, fp8 {fp8['seconds']:.0f} s"
    print(f"wall time per child (start-up included): {seconds}")


def main() -> None:
    args = parse_args()
    if args.child:
        print(RESULT + json.dumps(evaluate(args)), flush=True)
        return
    quant_config = calibrated(args)
    bf16 = run_child(args, "bf16", quant_config)
    fp8 = run_child(args, "fp8", quant_config)
    report(bf16, fp8, args.blocklist)


if __name__ == "__main__":
    main()
