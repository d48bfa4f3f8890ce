"""Merged prefill buckets ``(1, total tokens, total context blocks)``: a token
ladder up to the step budget; context 0 or the most one request holds. Below
``COMPUTE_BOUND_TOKENS`` a pass costs about one weight stream on Gaudi, so
coarse values pad cheaply; above, three values per doubling."""

import math

from vllm_hpu.bucketing.buckets import Bucket
from vllm_hpu.bucketing.settings import BucketingConfig

# Token values step by this many tokens below COMPUTE_BOUND_TOKENS.
SHORT_PASS_STEP = 64
COMPUTE_BOUND_TOKENS = 256
# Three values per doubling from COMPUTE_BOUND_TOKENS on: 4, 5 and 6 x 2**k.
PER_DOUBLING = (4, 5, 6)
# Token values with a cached-context bucket: the largest and every other one
# below it, this many (context passes are later chunks of long prompts, which
# fill the budget or hold its remainder, and prefix hits).
NUM_CONTEXT_TOKEN_VALUES = 3


def merged_token_ladder(config: BucketingConfig) -> list[int]:
    """Multiples of ``SHORT_PASS_STEP`` below ``COMPUTE_BOUND_TOKENS``, then
    three values per doubling, up to the step's token budget: 64, 128, 192,
    256, 320, 384, 512, 640, 768, 1024, 1280, 1536, 2048 for 2048."""
    budget = config.max_num_batched_tokens
    short = min(budget, COMPUTE_BOUND_TOKENS)
    values = set(range(SHORT_PASS_STEP, short, SHORT_PASS_STEP))
    scale = COMPUTE_BOUND_TOKENS // PER_DOUBLING[0]
    while scale * PER_DOUBLING[0] < budget:
        values.update(scale * m for m in PER_DOUBLING if scale * m < budget)
        scale *= 2
    return sorted(values | {budget})


def context_token_values(tokens: list[int], count: int | None = None) -> list[int]:
    """Every other token value from the largest down (``count`` of them, or
    all), ascending: the token values that get cached-context buckets."""
    return sorted(tokens[::-1][::2][:count])


def merged_contexts(config: BucketingConfig) -> list[int]:
    """0, and the most context blocks one request can hold: packs with more
    context than that run as two passes (rare: it takes several long hits)."""
    if not config.use_context_buckets:
        return [0]
    return [0, max(1, math.ceil((config.max_model_len - 1) / config.block_size))]


def merged_prompt_buckets(config: BucketingConfig) -> list[Bucket]:
    """Every token value without context; ``NUM_CONTEXT_TOKEN_VALUES`` with the most."""
    tokens = merged_token_ladder(config)
    most = merged_contexts(config)[-1]
    with_context = context_token_values(tokens, NUM_CONTEXT_TOKEN_VALUES)
    return sorted(
        {Bucket(1, t, 0) for t in tokens} | {Bucket(1, t, most) for t in with_context}
    )


def single_row_buckets(buckets: list[Bucket], source: str) -> list[Bucket]:
    """A bucket set's one-row buckets: the only ones a merged pass can use."""
    rows = [bucket for bucket in buckets if bucket.batch_size == 1]
    if not rows:
        raise ValueError(
            f"The {source} prompt buckets have no batch size 1, which merged prefill "
            "(VLLM_HPU_MERGED_PREFILL, on by default) pads every prompt pass to: add "
            "batch-1 buckets, or set VLLM_HPU_MERGED_PREFILL=false."
        )
    return rows
