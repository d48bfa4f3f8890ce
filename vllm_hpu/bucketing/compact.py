"""The default ``compact`` buckets: few graphs, spent where a workload pads.
Prompts: a short query ladder, few batch sizes, context only where a context
chunk runs. Decode: a block ladder per sequence, and for the largest batch one
up to the KV cache (padding rows is cheap, blocks not). See docs/bucketing.md."""

import dataclasses
import math

from vllm_hpu.bucketing.buckets import (
    Bucket,
    context_tokens,
    decode_block_cap,
    fillable_batch_sizes,
    smallest_padded,
)
from vllm_hpu.bucketing.ranges import geometric_range, points_per_doubling
from vllm_hpu.bucketing.settings import BucketingConfig


@dataclasses.dataclass(frozen=True)
class CompactShape:
    """The few knobs of the compact sets (module constants, tuned on traces)."""

    # Prompt query ladder: this many geometric points from a block to the budget.
    num_query_lens: int = 5
    # Prompt batch sizes (rows are padded to the longest chunk of their pass).
    prompt_batch_sizes: tuple[int, ...] = (1, 2, 3, 4)
    # Context buckets exist for passes of at most this many prompts.
    max_context_batch: int = 2
    # Context values besides 0: the maximum, then a quarter of it, and so on.
    num_context_values: int = 1
    # Decode block counts per batch size, in blocks per sequence of the batch.
    blocks_per_seq: tuple[int, ...] = (1, 2, 4)
    # Batch sizes below this one get one block per sequence only: they hold
    # few blocks in all, and their longer sequences run in this size's buckets.
    small_batch: int = 8
    # The largest batch size's block counts grow by this factor, from one
    # block per sequence up to the most the batch can hold.
    largest_batch_growth: float = math.sqrt(2)


COMPACT = CompactShape()


def compact_query_lens(config: BucketingConfig, shape: CompactShape) -> list[int]:
    block_size = config.block_size
    high = min(config.max_num_batched_tokens, config.max_model_len)
    high = max(block_size, high)
    return geometric_range(block_size, block_size, high, shape.num_query_lens)


def compact_contexts(config: BucketingConfig, shape: CompactShape) -> list[int]:
    if not config.use_context_buckets:
        return [0]
    most = max(1, math.ceil((config.max_model_len - 1) / config.block_size))
    ladder = {max(1, math.ceil(most / 4**i)) for i in range(shape.num_context_values)}
    return [0, *sorted(ladder)]


def compact_prompt_buckets(
    config: BucketingConfig, shape: CompactShape = COMPACT
) -> list[Bucket]:
    """(batch, query, context) within vLLM's limits, as the linear filter keeps."""
    batch_sizes = [b for b in shape.prompt_batch_sizes if b <= config.max_num_seqs]
    batch_sizes = batch_sizes or [1]
    query_lens = compact_query_lens(config, shape)
    contexts = compact_contexts(config, shape)
    buckets = []
    low_batches = smallest_padded(batch_sizes, 1)
    low_queries = smallest_padded(query_lens, 1)
    low_contexts = smallest_padded(contexts, 0)
    for batch_size, low_batch in zip(batch_sizes, low_batches, strict=True):
        for query_len, low_query in zip(query_lens, low_queries, strict=True):
            if low_batch * low_query > config.max_num_batched_tokens:
                continue
            for blocks, low_blocks in zip(contexts, low_contexts, strict=True):
                if blocks and batch_size > shape.max_context_batch:
                    continue
                low_context = context_tokens(low_blocks, config.block_size)
                if low_query + low_context <= config.max_model_len:
                    buckets.append(Bucket(batch_size, query_len, blocks))
    return buckets


def compact_decode_batch_sizes(config: BucketingConfig) -> list[int]:
    """One point per doubling of max_num_seqs: the reference's decode batch ladder."""
    seqs = config.max_num_seqs
    return geometric_range(1, 2, seqs, points_per_doubling(seqs)) if seqs > 1 else [1]


def growing_block_counts(batch_size: int, cap: int, growth: float) -> list[int]:
    """``batch_size`` x 1, ``growth``, ``growth**2``, ... blocks, up to ``cap``."""
    counts = set()
    per_seq = 1.0
    while round(batch_size * per_seq, 6) < cap:
        counts.add(math.ceil(round(batch_size * per_seq, 6)))
        per_seq *= growth
    return sorted(counts | {cap})


def short_sequence_buckets(
    config: BucketingConfig,
    batch_sizes: list[int],
    num_kv_blocks: int,
    shape: CompactShape = COMPACT,
) -> set[Bucket]:
    """Each batch size b: b x 1, 2, 4 blocks (1 below ``small_batch``) that fit."""
    buckets: set[Bucket] = set()
    for batch_size in batch_sizes:
        cap = decode_block_cap(config, batch_size, num_kv_blocks)
        small = batch_size < shape.small_batch
        ratios = shape.blocks_per_seq[:1] if small else shape.blocks_per_seq
        buckets.update(Bucket(batch_size, 1, min(cap, batch_size * r)) for r in ratios)
    return buckets


def compact_decode_buckets(
    config: BucketingConfig, num_kv_blocks: int, shape: CompactShape = COMPACT
) -> list[Bucket]:
    """Short sequences at every batch size; for the largest fillable one, block counts
    growing by ``largest_batch_growth`` to the most it holds (every batch fits one)."""
    *smaller, largest = fillable_batch_sizes(
        compact_decode_batch_sizes(config), num_kv_blocks
    )
    cap = decode_block_cap(config, largest, num_kv_blocks)
    growth = shape.largest_batch_growth
    buckets = short_sequence_buckets(config, smaller, num_kv_blocks, shape)
    buckets.update(
        Bucket(largest, 1, n) for n in growing_block_counts(largest, cap, growth)
    )
    return sorted(buckets)
