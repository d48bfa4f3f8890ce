"""Warmup time and bucket count at start-up, linear vs exponential bucketing;
with ``--restart``, a warm restart from VLLM_HPU_CACHE_DIR.

Each configuration starts a fresh engine in a child process (the plugin reads its
variables once per process), compiled with VLLM_HPU_COMPILE_BACKEND, and reports
the buckets it warmed and the seconds compile_or_warm_up_model took.

``--restart`` starts the same engine twice, then once with the other dtype, all
with one VLLM_HPU_CACHE_DIR and each with an empty inductor cache of its own (as
a new pod has): the second warmup should load every graph, the third none.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

DEFAULT_MODEL = ".cache/models/smollm2-135m-instruct"
RESULT = "startup-result: "
RESTART_KV_CACHE_BYTES = 64 << 20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--backend", default="eager", help="VLLM_HPU_COMPILE_BACKEND")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--kv-cache-memory-bytes",
        type=int,
        help="a fixed KV cache (default: the memory split; --restart: 64 MiB, "
        "since a warm restart needs the same block count each start)",
    )
    parser.add_argument(
        "--restart",
        action="store_true",
        help="start twice from one VLLM_HPU_CACHE_DIR, then with the other dtype",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    return args


def measure(args: argparse.Namespace) -> dict[str, float]:
    """In the child: start the engine, report its buckets and warmup time."""
    from vllm import LLM

    from vllm_hpu.worker.compilation.compile_cache import graphs_compiled

    started = time.perf_counter()
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
    )
    engine = llm.llm_engine
    runner = engine.engine_core.engine_core.model_executor.driver_worker.worker
    buckets = runner.model_runner.buckets
    reused, compiled = graphs_compiled()
    return {
        "graphs_reused": reused,
        "graphs_compiled": compiled,
        "prompt_buckets": len(buckets.prompt_buckets),
        "decode_buckets": len(buckets.decode_buckets),
        "warmup_s": engine.vllm_config.compilation_config.compilation_time,
        "startup_s": time.perf_counter() - started,
    }


def run_child(
    args: argparse.Namespace, exponential: bool, **extra: str
) -> dict[str, Any]:
    """One start in a fresh process; ``extra``: variables, and ``dtype``."""
    dtype = extra.pop("dtype", args.dtype)
    env = dict(
        os.environ,
        VLLM_HPU_EMULATION=os.environ.get("VLLM_HPU_EMULATION", "1"),
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_HPU_COMPILE_BACKEND=args.backend,
        VLLM_EXPONENTIAL_BUCKETING="1" if exponential else "0",
        **extra,
    )
    command = [sys.executable, __file__, "--child", *args.argv, "--dtype", dtype]
    if args.restart and args.kv_cache_memory_bytes is None:
        command += ["--kv-cache-memory-bytes", str(RESTART_KV_CACHE_BYTES)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(done.stderr[-4000:])
    # vLLM logs to stdout as well, also after the result line.
    (line,) = [x for x in done.stdout.splitlines() if x.startswith(RESULT)]
    result = json.loads(line.removeprefix(RESULT))
    logs = (done.stdout + done.stderr).splitlines()
    result["cache_log"] = [x for x in logs if "Compile cache" in x]
    return result


def restart(args: argparse.Namespace) -> None:
    """Same engine twice from one cache folder, then the other dtype."""
    other_dtype = "bfloat16" if args.dtype == "float32" else "float32"
    print("| start | dtype | graphs from cache | compiled | warmup s | start-up s |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        warmups = []
        for label, dtype in (
            ("first", args.dtype),
            ("restart", args.dtype),
            ("dtype changed", other_dtype),
        ):
            result = run_child(
                args,
                False,
                dtype=dtype,
                VLLM_HPU_CACHE_DIR=f"{folder}/hpu",
                TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(dir=folder),
            )
            warmups.append(result["warmup_s"])
            print(
                f"| {label} | {dtype} | {result['graphs_reused']} "
                f"| {result['graphs_compiled']} | {result['warmup_s']:.1f} "
                f"| {result['startup_s']:.1f} |"
            )
    print(f"restart warmup / first warmup: {warmups[1] / warmups[0]:.0%}")


def main() -> None:
    args = parse_args()
    if args.child:
        print(RESULT + json.dumps(measure(args)), flush=True)
        return
    if args.restart:
        restart(args)
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
