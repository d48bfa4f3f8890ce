"""Record the benchmark workload's step shapes under one configuration's limits.

Runs the seeded workload through ``LLM(...)`` on the plugin in emulation with a tiny
random-weight model (shapes depend on vLLM's scheduler, not on the model), with
``VLLM_HPU_BUCKET_TRACE`` set: the runner writes the trace. One process per trace,
since the plugin reads its variables once.
"""

import argparse
import os
import random
import sys
from pathlib import Path

from benchmarks.vllm_system import run_requests
from benchmarks.workload import WorkloadSpec, make_workload

TRACE_MODEL = ".cache/models/tiny-llama"
# tiny-llama's KV bytes per 128-token block in float32: layers x K,V x tokens x
# kv heads x head size x 4 bytes.
TINY_LLAMA_KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 64 * 4


def record(args: argparse.Namespace) -> None:
    from vllm import LLM

    token_ids = list(range(3, 1024))  # tiny-llama's vocabulary minus specials
    spec = WorkloadSpec(
        args.num_requests,
        args.seed,
        output_max=args.output_max,
        output_min=args.output_min,
        prompt_median=args.prompt_median,
        prompt_max=args.prompt_max,
    )
    requests = make_workload(spec, token_ids)
    # vLLM sizes the cache by bytes; the dummy block needs no room of its own.
    kv_bytes = args.num_kv_blocks * args.block_size * TINY_LLAMA_KV_BYTES_PER_TOKEN
    llm = LLM(
        model=args.model,
        dtype="float32",
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        enable_prefix_caching=True,
        enable_chunked_prefill=True,
        kv_cache_memory_bytes=kv_bytes,
        hf_overrides={"max_position_embeddings": args.max_model_len},
        seed=0,
    )
    run_requests(llm, requests)
    llm.llm_engine.engine_core.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-num-seqs", type=int, required=True)
    parser.add_argument("--max-num-batched-tokens", type=int, required=True)
    parser.add_argument("--max-model-len", type=int, required=True)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--num-kv-blocks", type=int, required=True)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    defaults = WorkloadSpec()
    for name in ("output_min", "output_max", "prompt_median", "prompt_max"):
        parser.add_argument(
            "--" + name.replace("_", "-"), type=int, default=getattr(defaults, name)
        )
    parser.add_argument("--model", default=TRACE_MODEL)
    args = parser.parse_args()
    environ = {
        "VLLM_HPU_EMULATION": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_HPU_EXACT_SHAPES": "1",  # nothing to pad: the trace is unpadded
        "VLLM_SKIP_WARMUP": "1",
        "VLLM_HPU_BUCKET_TRACE": str(args.out),
    }
    if any(os.environ.get(name) != value for name, value in environ.items()):
        # The plugin reads its variables once: start afresh with them set.
        os.environ.update(environ)
        os.execv(sys.executable, [sys.executable, "-m", __spec__.name, *sys.argv[1:]])
    random.seed(args.seed)
    record(args)


if __name__ == "__main__":
    main()
