"""Prompt buckets of merged prefill: ``(1, total tokens, total context blocks)``.

A merged pass packs the step's prompt chunks into one sequence, so its buckets
depend on the tokens of the whole step, not on batch x longest chunk: a token
ladder up to the step budget, and context 0 or the most one request can hold.
"""

import math

from vllm_hpu.bucketing.buckets import Bucket
from vllm_hpu.bucketing.ranges import geometric_range, points_per_doubling
from vllm_hpu.bucketing.settings import BucketingConfig


def merged_token_ladder(config: BucketingConfig) -> list[int]:
    """A geometric token ladder, one point per doubling less one, reaching the
    step's token budget: 128, 256, ..., 1536, 2048 for 2048 at block 128."""
    block_size = config.block_size
    high = max(block_size, config.max_num_batched_tokens)
    return geometric_range(block_size, block_size, high, points_per_doubling(high) - 2)


def merged_contexts(config: BucketingConfig) -> list[int]:
    """0, and the most context blocks one request can hold: packs with more
    context than that run as two passes (rare: it takes several long hits)."""
    if not config.use_context_buckets:
        return [0]
    return [0, max(1, math.ceil((config.max_model_len - 1) / config.block_size))]


def merged_prompt_buckets(config: BucketingConfig) -> list[Bucket]:
    return [
        Bucket(1, tokens, blocks)
        for tokens in merged_token_ladder(config)
        for blocks in merged_contexts(config)
    ]


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
