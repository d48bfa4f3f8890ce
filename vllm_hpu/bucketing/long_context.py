"""Compact buckets for long contexts (``max_model_len`` >= 32k): context and
decode block counts on a square-root ladder (``low + (high - low) * (k / n) ** 2``,
top gaps near 2 / n whatever the context); context also doubles from one block
below where that ladder's steps outgrow its values. See docs/long-context.md."""

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

    # Square-root context values (in blocks, up to the most one request holds).
    num_context_values: int = 8
    # Context buckets pair with this many token values, every other one from
    # the largest down: long prompts' chunks fill the step, and context costs
    # attention only.
    num_context_token_values: int = 5
    # The doubling foot's values (1, 2, 4, ... blocks: short prefix hits, a
    # prompt's chunk after a short first one) pair with this many: a padded
    # context block costs attention for every token of the pass, so fine
    # steps pay off in full passes; short passes take a square-root value.
    num_foot_token_values: int = 2
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


def context_ladder(most: int, count: int) -> tuple[list[int], list[int]]:
    """Context block values up to ``most``: the doubling foot ``1, 2, 4, ...``
    below ``4 most / count**2``, then the square-root ladder's values from
    there on. The ladder steps by about ``2 sqrt(v most) / count`` at ``v``,
    more than ``v`` itself below that point, where doubling pads less; the
    foot grows with the context (4 values at 256 blocks, 9 at 8192)."""
    crossover = 4 * most / count**2
    foot = [2**i for i in range(math.ceil(math.log2(max(crossover, 1))))]
    upper = [v for v in square_root_ladder(0, most, count) if v >= crossover]
    return foot, upper


def long_context_prompt_buckets(
    config: BucketingConfig, shape: LongContextShape = LONG_CONTEXT
) -> list[Bucket]:
    """Merged prefill's ``(1, tokens, context)``: every token value without
    context; ``num_context_token_values`` of them with each square-root
    context value, ``num_foot_token_values`` with each value of the foot."""
    tokens = merged_token_ladder(config)
    buckets = [Bucket(1, t, 0) for t in tokens]
    if not config.use_context_buckets:
        return buckets
    most = max(1, math.ceil((config.max_model_len - 1) / config.block_size))
    foot, upper = context_ladder(most, shape.num_context_values)
    for contexts, count in (
        (foot, shape.num_foot_token_values),
        (upper, shape.num_context_token_values),
    ):
        with_context = context_token_values(tokens, count)
        buckets += [Bucket(1, t, c) for t in with_context for c in contexts]
    return buckets


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
