"""--kv-cache-dtype fp8_inc end to end: twice the blocks of bf16 in one budget,
and generations (prefix-cache hits read fp8 context) close to bf16's."""

import pytest
from models import model_path as model_dir

from e2e.harness import random_prompts, vllm_engine, vllm_greedy

pytestmark = pytest.mark.slow

MAX_TOKENS = 8
# Greedy tokens of the fp8 cache that equal bf16's (100 % measured on tiny-llama).
MIN_AGREEMENT = 0.9


def _generate(kv_cache_dtype: str) -> tuple[list[list[int]], int, float]:
    """Greedy tokens, the engine's block count and its prefix-cache hits."""
    shared = random_prompts([40], 1000, seed=7)[0]
    prompts = [shared + tail for tail in random_prompts([3, 20], 1000, seed=8)]
    with vllm_engine(
        model_dir("tiny-llama"),
        dtype="bfloat16",
        kv_cache_dtype=kv_cache_dtype,
        block_size=16,
        enable_prefix_caching=True,
        max_model_len=128,
    ) as llm:
        first = vllm_greedy(llm, prompts[:1], MAX_TOKENS)
        rest = vllm_greedy(llm, prompts[1:], MAX_TOKENS)
        num_blocks = llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
        metrics = {m.name: m for m in llm.get_metrics()}
    hits = metrics["vllm:prefix_cache_hits"].value
    return first + rest, num_blocks, hits


def test_fp8_inc_cache_holds_twice_the_blocks_and_generates():
    bf16_tokens, bf16_blocks, _ = _generate("auto")
    fp8_tokens, fp8_blocks, fp8_hits = _generate("fp8")  # runs as fp8_inc
    bf16_flat = [t for s in bf16_tokens for t in s]
    fp8_flat = [t for s in fp8_tokens for t in s]
    agreement = sum(a == b for a, b in zip(bf16_flat, fp8_flat, strict=True))
    agreement /= len(bf16_flat)
    assert agreement >= MIN_AGREEMENT, f"{agreement:.0%} of greedy tokens agree"
    assert fp8_blocks == 2 * bf16_blocks
    assert fp8_hits > 0
    # The first token of a prefix hit is computed from fp8 context only.
    assert [s[0] for s in fp8_tokens] == [s[0] for s in bf16_tokens]
