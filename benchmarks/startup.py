"""Warmup time and bucket count at start-up, linear vs exponential bucketing.

Each configuration starts a fresh engine in a child process (the plugin reads its
variables once per process), compiled with VLLM_HPU_COMPILE_BACKEND, and reports
the buckets it warmed and the seconds compile_or_warm_up_model took.
"""

import argparse
import json
import os
import subprocess
import sys
import time

DEFAULT_MODEL = ".cache/models/smollm2-135m-instruct"
RESULT = "startup-result: "


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--backend", default="eager", help="VLLM_HPU_COMPILE_BACKEND")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args()


def measure(args: argparse.Namespace) -> dict[str, float]:
    """In the child: start the engine, report its buckets and warmup time."""
    from vllm import LLM

    started = time.perf_counter()
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    engine = llm.llm_engine
    runner = engine.engine_core.engine_core.model_executor.driver_worker.worker
    buckets = runner.model_runner.buckets
    return {
        "prompt_buckets": len(buckets.prompt_buckets),
        "decode_buckets": len(buckets.decode_buckets),
        "warmup_s": engine.vllm_config.compilation_config.compilation_time,
        "startup_s": time.perf_counter() - started,
    }


def run_child(args: argparse.Namespace, exponential: bool) -> dict[str, float]:
    env = dict(
        os.environ,
        VLLM_HPU_EMULATION=os.environ.get("VLLM_HPU_EMULATION", "1"),
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_HPU_COMPILE_BACKEND=args.backend,
        VLLM_EXPONENTIAL_BUCKETING="1" if exponential else "0",
    )
    command = [sys.executable, __file__, "--child", *sys.argv[1:]]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(done.stderr[-4000:])
    # vLLM logs to stdout as well, also after the result line.
    (line,) = [x for x in done.stdout.splitlines() if x.startswith(RESULT)]
    return json.loads(line.removeprefix(RESULT))


def main() -> None:
    args = parse_args()
    if args.child:
        print(RESULT + json.dumps(measure(args)), flush=True)
        return
    print(
        f"{args.model}: max_model_len={args.max_model_len} "
        f"max_num_seqs={args.max_num_seqs} "
        f"max_num_batched_tokens={args.max_num_batched_tokens} backend={args.backend}"
    )
    print("| spacing | buckets (prompt+decode) | warmup s | start-up s |")
    print("|---|---|---|---|")
    for exponential in (False, True):
        result = run_child(args, exponential)
        print(
            f"| {'exponential' if exponential else 'linear'} "
            f"| {result['prompt_buckets']}+{result['decode_buckets']} "
            f"| {result['warmup_s']:.1f} | {result['startup_s']:.1f} |"
        )


if __name__ == "__main__":
    main()
