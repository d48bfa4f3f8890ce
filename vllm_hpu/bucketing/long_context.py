"""Compact buckets for long contexts (``max_model_len`` >= 32k): context and
decode block counts on a square-root ladder. The compact set padded 67-72 % of
a long trace's context blocks (docs/long-context.md); ``low + (high - low) *
(k / n) ** 2`` keeps top gaps near 2 / n, so graphs do not grow with context."""

import dataclasses
import math

from vllm_hpu.bucketing.buckets import (
    Bucket,
    decode_block_cap,
    fillable_batch_sizes,
)
from vllm_hpu.bucketing.compact import (
    COMPACT,
    compact_decode_batch_sizes,
    growing_block_counts,
    short_sequence_buckets,
)
from vllm_hpu.bucketing.merged_buckets import context_token_values, merged_token_ladder
from vllm_hpu.bucketing.settings import BucketingConfig

# From this max_model_len on, the compact strategy uses these ladders.
LONG_CONTEXT_LEN = 32768


@dataclasses.dataclass(frozen=True)
class LongContextShape:
    """The knobs, chosen on the long-context traces of benchmarks/long_context.py."""

    # Context values besides 0 (in blocks, up to the most one request holds).
    num_context_values: int = 8
    # Context buckets pair with this many token values, every other one from
    # the largest down: long prompts' chunks fill the step, and context costs
    # attention only.
    num_context_token_values: int = 5
    # Decode block values of all batch sizes together, at least this many each.
    num_decode_values: int = 64
    min_decode_values: int = 8


LONG_CONTEXT = LongContextShape()


def is_long_context(config: BucketingConfig) -> bool:
    return config.max_model_len >= LONG_CONTEXT_LEN


def square_root_ladder(low: int, high: int, count: int) -> list[int]:
    """``count`` values from above ``low`` up to ``high``, each rounded up:
    ``low + (high - low) * (k / count) ** 2`` for k = 1 .. count, deduplicated."""
    values = {
        math.ceil(low + (high - low) * (k / count) ** 2) for k in range(1, count + 1)
    }
    return sorted(values)


def long_context_values(config: BucketingConfig, shape: LongContextShape) -> list[int]:
    """Context block values: 0, then the ladder up to the most one request holds."""
    if not config.use_context_buckets:
        return [0]
    most = max(1, math.ceil((config.max_model_len - 1) / config.block_size))
    return [0, *square_root_ladder(0, most, shape.num_context_values)]


def long_context_prompt_buckets(
    config: BucketingConfig, shape: LongContextShape = LONG_CONTEXT
) -> list[Bucket]:
    """Merged prefill's ``(1, tokens, context)``: every token value without
    context, ``num_context_token_values`` of them with each context value."""
    tokens = merged_token_ladder(config)
    with_context = context_token_values(tokens, shape.num_context_token_values)
    contexts = long_context_values(config, shape)[1:]
    return [Bucket(1, t, 0) for t in tokens] + [
        Bucket(1, t, c) for t in with_context for c in contexts
    ]


def long_context_decode_buckets(
    config: BucketingConfig,
    num_kv_blocks: int,
    shape: LongContextShape = LONG_CONTEXT,
) -> list[Bucket]:
    """The compact set's short-sequence buckets plus, per batch size, a ladder up to
    the most blocks it can hold, so long sequences keep their own batch size."""
    batch_sizes = fillable_batch_sizes(
        compact_decode_batch_sizes(config), num_kv_blocks
    )
    *smaller, largest = batch_sizes
    buckets = short_sequence_buckets(config, smaller, num_kv_blocks)
    short = min(num_kv_blocks, largest * max(COMPACT.blocks_per_seq))
    growth = COMPACT.largest_batch_growth
    buckets.update(
        Bucket(largest, 1, n) for n in growing_block_counts(largest, short, growth)
    )
    per_batch = max(
        shape.min_decode_values, shape.num_decode_values // len(batch_sizes)
    )
    for batch_size in batch_sizes:
        cap = decode_block_cap(config, batch_size, num_kv_blocks)
        for blocks in square_root_ladder(min(batch_size, cap), cap, per_batch):
            buckets.add(Bucket(batch_size, 1, blocks))
    return sorted(buckets)
