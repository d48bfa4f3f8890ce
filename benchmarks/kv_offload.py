"""Time to first token with a long shared prefix recomputed, loaded back from
host memory (--kv-offloading-size), and found in the device cache, in one run.

One engine (SmolLM2-135M by default, float32) whose device KV cache holds one
prefix but not the filler prompts sent after it: each round sends a new prefix
(recomputed), two fillers that evict it from the device, the prefix again with
another suffix (its blocks come back from host memory), and once more (a
device prefix-cache hit). TTFT is the wall time of a one-token request.

Run: VLLM_HPU_EMULATION=1 PYTHONPATH=$PWD python -m benchmarks.kv_offload
"""

import argparse
import json
import os
import random
import statistics
import time
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

DEFAULT_MODEL = ".cache/models/smollm2-135m-instruct"
BLOCK_SIZE = 128
SUFFIX_TOKENS = 16


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prefix-tokens", type=int, default=1536)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--host-gib", type=float, default=0.5)
    return parser.parse_args()


def block_bytes(model: str, dtype_bytes: int) -> int:
    """Device bytes of one KV block of ``model`` (keys and values, all layers)."""
    with open(os.path.join(model, "config.json")) as f:
        config = json.load(f)
    head_size = config.get("head_dim") or (
        config["hidden_size"] // config["num_attention_heads"]
    )
    per_token = 2 * config["num_key_value_heads"] * head_size * dtype_bytes
    return config["num_hidden_layers"] * per_token * BLOCK_SIZE


def counters(llm: Any) -> dict[str, float]:
    totals: dict[str, float] = {}
    for metric in llm.get_metrics():
        value = getattr(metric, "value", None)
        if isinstance(value, (int, float)):
            totals[metric.name] = totals.get(metric.name, 0) + value
    return totals


def one_round(llm: Any, args: argparse.Namespace, rng: random.Random) -> dict:
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=0.0)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(3, 40000) for _ in range(n)]

    def ttft(prompt: list[int]) -> float:
        started = time.perf_counter()
        llm.generate(TokensPrompt(prompt_token_ids=prompt), params, use_tqdm=False)
        return time.perf_counter() - started

    prefix = tokens(args.prefix_tokens)
    recompute = ttft(prefix + tokens(SUFFIX_TOKENS))
    for _ in range(2):  # fill the device cache: the prefix is evicted
        ttft(tokens(args.prefix_tokens))
    before = counters(llm)
    host = ttft(prefix + tokens(SUFFIX_TOKENS))
    after = counters(llm)
    device = ttft(prefix + tokens(SUFFIX_TOKENS))
    hits = "vllm:external_prefix_cache_hits"
    return {
        "recompute_s": round(recompute, 4),
        "host_load_s": round(host, 4),
        "device_hit_s": round(device, 4),
        "tokens_from_host": after.get(hits, 0) - before.get(hits, 0),
    }


def main() -> None:
    from vllm import LLM

    from vllm_hpu.patches.torchvision_import import allow_torchvision_import

    allow_torchvision_import()
    args = parse_args()
    dtype_bytes = 2 if args.dtype in ("bfloat16", "float16") else 4
    # Room for one prefix and its suffix, not for the two fillers after it.
    num_device_blocks = -(-(args.prefix_tokens + SUFFIX_TOKENS) // BLOCK_SIZE) + 2
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        max_model_len=args.prefix_tokens + 2 * SUFFIX_TOKENS,
        block_size=BLOCK_SIZE,
        seed=0,
        enforce_eager=True,
        disable_log_stats=False,
        kv_cache_memory_bytes=num_device_blocks * block_bytes(args.model, dtype_bytes),
        kv_offloading_size=args.host_gib,
    )
    rng = random.Random(0)
    rounds = [one_round(llm, args, rng) for _ in range(args.rounds)]
    for result in rounds:
        print(json.dumps(result))
    recompute = statistics.median(r["recompute_s"] for r in rounds)
    host = statistics.median(r["host_load_s"] for r in rounds)
    summary = {
        "model": os.path.basename(args.model.rstrip("/")),
        "prefix_tokens": args.prefix_tokens,
        "device_blocks": num_device_blocks,
        "median_recompute_s": recompute,
        "median_host_load_s": host,
        "median_device_hit_s": statistics.median(r["device_hit_s"] for r in rounds),
        "recompute_over_host_load": round(recompute / host, 2),
    }
    print(json.dumps(summary))
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
