"""Tokens per second with and without speculative decoding (n-gram, a draft
model), the acceptance rate from vLLM's spec-decode metrics, and whether the
greedy outputs equal those without speculation (SmolLM2 by default, drafting
for itself unless --draft-model names a smaller model sharing its tokenizer).

Run: VLLM_HPU_EMULATION=1 PYTHONPATH=$PWD python -m benchmarks.spec_decode
"""

import argparse
import dataclasses
import gc
import json
import os
import time
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

DEFAULT_MODEL = ".cache/models/smollm2-135m-instruct"
# Repetitive text, where prompt lookup has something to find.
PROMPTS = [
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
    "The cat sat on the mat. The cat sat on the mat. The cat",
    "apple banana cherry apple banana cherry apple banana",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef",
]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--num-speculative-tokens", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--methods",
        default="ngram,draft_model",
        help="comma-separated proposers to compare with no speculation",
    )
    parser.add_argument(
        "--draft-model", help="the draft_model proposer's model (default: --model)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="generate the batch this many times per engine; tokens/s of the "
        "fastest (a shared machine's load only slows runs down)",
    )
    return parser.parse_args()


def padding_ratios(worker: Any) -> dict[str, float]:
    """Each padding counter's share of padding (verification: ``verify``)."""
    stats = worker.model_runner.buckets.stats
    counters = {f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)}
    return {name: round(counter.ratio, 3) for name, counter in counters.items()}


def run(
    args: argparse.Namespace, speculative_config: dict | None
) -> tuple[dict, list[list[int]]]:
    """One engine: output tokens per second of the greedy batch, and the
    spec-decode counters (absent without speculative decoding); its tokens."""
    from vllm import LLM, SamplingParams
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        max_model_len=512,
        seed=0,
        # Sized explicitly: a second engine in this process cannot profile memory.
        kv_cache_memory_bytes=256 << 20,
        disable_log_stats=False,
        speculative_config=speculative_config,
    )
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    seconds = float("inf")
    for _ in range(args.repeats):
        started = time.perf_counter()
        outputs = llm.generate(PROMPTS, params, use_tqdm=False)
        seconds = min(seconds, time.perf_counter() - started)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    num_tokens = sum(len(t) for t in tokens)
    metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    padding = llm.collective_rpc(padding_ratios)[0]
    drafted = metrics.get("vllm:spec_decode_num_draft_tokens") or 0
    accepted = metrics.get("vllm:spec_decode_num_accepted_tokens") or 0
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()
    config = speculative_config or {}
    result = {
        "method": config.get("method", "none"),
        "draft": config.get("model"),
        "tokens_per_s": round(num_tokens / seconds, 2),
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
        "padding": padding,
    }
    return result, tokens


def main() -> None:
    from vllm_hpu.patches import allow_torchvision_import

    allow_torchvision_import()
    args = parse_args()
    ngram = {
        "method": "ngram",
        "num_speculative_tokens": args.num_speculative_tokens,
        "prompt_lookup_min": 1,
        "prompt_lookup_max": 3,
    }
    draft_model = {
        "method": "draft_model",
        "model": args.draft_model or args.model,
        "num_speculative_tokens": args.num_speculative_tokens,
    }
    result, reference = run(args, None)
    print(json.dumps(result))
    configs = {"ngram": ngram, "draft_model": draft_model}
    for method in args.methods.split(","):
        result, tokens = run(args, configs[method])
        print(json.dumps({**result, "same_tokens_as_none": tokens == reference}))


if __name__ == "__main__":
    main()
