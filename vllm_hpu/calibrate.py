"""Calibrate a model for INC FP8 serving from a local prompt file:

    python -m vllm_hpu.calibrate <model> --dataset prompts.jsonl --output <dir>

runs MEASURE in a child engine and writes ``<dir>/maxabs_quant.json``; serve
with ``QUANT_CONFIG=<dir>/maxabs_quant.json vllm serve <model> --quantization
inc --kv-cache-dtype fp8_inc``. Dataset lines: {"prompt"|"text": ...} or a string."""

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from vllm_hpu import envs

MEASURE_CONFIG = "maxabs_measure.json"
QUANT_CONFIG = "maxabs_quant.json"
DUMP_NAME = "inc_output"  # INC adds _hooks_maxabs[_<rank>_<world>].npz / .json


def read_prompts(dataset: Path, max_samples: int) -> list[str]:
    """The prompts of a JSON-lines file, naming the file and line on bad input."""
    prompts = []
    for number, line in enumerate(dataset.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise SystemExit(f"{dataset}:{number}: not JSON ({error}).") from None
        prompt = record if isinstance(record, str) else _prompt_field(record)
        if not prompt:
            raise SystemExit(f"{dataset}:{number}: no 'prompt' or 'text' field.")
        prompts.append(prompt)
    if not prompts:
        raise SystemExit(f"{dataset}: no prompts.")
    return prompts[:max_samples]


def _prompt_field(record: Any) -> str:
    if not isinstance(record, dict):
        return ""
    return str(record.get("prompt") or record.get("text") or "")


def inc_configs(
    output: Path, scale_method: str, blocklist: list[str]
) -> dict[str, dict[str, Any]]:
    """The MEASURE and QUANTIZE configs, as Gaudi's calibration writes them;
    modules named in ``blocklist`` stay in bf16 when serving."""
    common = {
        "observer": "maxabs",
        "allowlist": {"types": [], "names": []},
        "dump_stats_path": str(output.resolve() / DUMP_NAME),
    }
    return {
        MEASURE_CONFIG: {
            "mode": "MEASURE",
            "blocklist": {"types": [], "names": []},
            **common,
        },
        QUANT_CONFIG: {
            "mode": "QUANTIZE",
            "scale_method": scale_method,
            "blocklist": {"types": [], "names": blocklist},
            **common,
        },
    }


def run_measure_pass(args: argparse.Namespace) -> None:
    """The MEASURE engine (QUANT_CONFIG is set by the parent): generate over the
    prompts, then write the measurements (shutdown_inc) before the engine goes."""
    from vllm import LLM, SamplingParams

    prompts = read_prompts(args.dataset, args.max_samples)
    llm = LLM(
        model=args.model,
        dtype="bfloat16",
        quantization="inc",
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        tensor_parallel_size=args.tensor_parallel_size,
    )
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    llm.generate(prompts, params)
    llm.collective_rpc("shutdown_inc")
    del llm


def calibrate(args: argparse.Namespace) -> Path:
    """Write both configs, measure in a child process; the QUANTIZE config's path."""
    read_prompts(args.dataset, args.max_samples)  # bad input fails before the engine
    args.output.mkdir(parents=True, exist_ok=True)
    configs = inc_configs(args.output, args.scale_method, args.blocklist)
    for name, config in configs.items():
        (args.output / name).write_text(json.dumps(config, indent=2) + "\n")
    environ = envs.process_environ()
    env = {**environ, "QUANT_CONFIG": str(args.output / MEASURE_CONFIG)}
    command = [sys.executable, "-m", "vllm_hpu.calibrate", *sys_args(args)]
    subprocess.run([*command, "--measure-pass"], env=env, check=True)
    measurements = sorted(args.output.glob(f"{DUMP_NAME}_hooks_maxabs*.npz"))
    if not measurements:
        raise SystemExit(f"The MEASURE pass wrote no measurements in {args.output}.")
    return args.output / QUANT_CONFIG


def sys_args(args: argparse.Namespace) -> list[str]:
    """``args`` as the command line that gave them (for the child process)."""
    return [
        args.model,
        f"--dataset={args.dataset}",
        f"--output={args.output}",
        f"--max-samples={args.max_samples}",
        f"--max-tokens={args.max_tokens}",
        f"--max-model-len={args.max_model_len}",
        f"--max-num-batched-tokens={args.max_num_batched_tokens}",
        f"--tensor-parallel-size={args.tensor_parallel_size}",
        f"--scale-method={args.scale_method}",
        *(f"--blocklist={name}" for name in args.blocklist),
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m vllm_hpu.calibrate")
    parser.add_argument("model", help="model directory or name")
    parser.add_argument("--dataset", type=Path, required=True, help="local JSONL")
    parser.add_argument("--output", type=Path, required=True, help="folder to write")
    parser.add_argument("--max-samples", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=16, help="per prompt")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument(
        "--scale-method",
        default="maxabs_hw",
        choices=["maxabs_hw", "maxabs_pow2", "unit_scale"],
        help="the QUANTIZE config's scale method",
    )
    parser.add_argument(
        "--blocklist",
        action="append",
        default=[],
        metavar="NAME",
        help="a module left in bf16 when serving, e.g. lm_head (repeatable)",
    )
    parser.add_argument(
        "--measure-pass",
        action="store_true",
        help="run the MEASURE engine in this process (QUANT_CONFIG set); "
        "the command runs itself this way",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.measure_pass:
        run_measure_pass(args)
        return
    quant_config = calibrate(args)
    print(
        f"Measurements written. Serve with:\n  QUANT_CONFIG={quant_config} "
        f"vllm serve {args.model} --quantization inc --kv-cache-dtype fp8_inc "
        "--dtype bfloat16"
    )


if __name__ == "__main__":
    main()
