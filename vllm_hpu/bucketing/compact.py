"""The default ``compact`` buckets: few graphs, spent where a mixed workload pads.

Prompt passes get a short query ladder and few batch sizes, with cached-context
buckets only where a context chunk runs; decode block counts are tied to the batch
size (a ladder in blocks per sequence), so no graph is spent on a block count its
batch cannot reach or would pad to little use. docs/bucketing.md has the numbers.
"""

import dataclasses
import math

from vllm_hpu.bucketing.buckets import Bucket, context_tokens, smallest_padded
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
    # Decode block counts per batch size, in blocks per sequence of the batch;
    # the batch's cap (KV cache, max_model_len) is always one more.
    blocks_per_seq: tuple[float, ...] = (2.5, 3.5, 5)
    # Batches below this size pad few blocks in all: one ratio is enough.
    small_batch: int = 4
    small_blocks_per_seq: tuple[float, ...] = (5,)


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


def compact_decode_buckets(
    config: BucketingConfig, num_kv_blocks: int, shape: CompactShape = COMPACT
) -> list[Bucket]:
    """Per batch size: ``ceil(batch * k)`` blocks for ``k`` in the per-sequence
    ladder, and the most blocks the batch can hold."""
    blocks_per_seq = math.ceil(config.max_model_len / config.block_size)
    buckets = set()
    for batch_size in compact_decode_batch_sizes(config):
        cap = min(num_kv_blocks, batch_size * blocks_per_seq)
        small = batch_size < shape.small_batch
        for ratio in shape.small_blocks_per_seq if small else shape.blocks_per_seq:
            blocks = min(cap, math.ceil(batch_size * ratio))
            buckets.add(Bucket(batch_size, 1, max(blocks, min(batch_size, cap))))
        buckets.add(Bucket(batch_size, 1, cap))
    return sorted(buckets)
