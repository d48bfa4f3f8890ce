"""The reference Gaudi stack's default (exponential) buckets, reproduced for
comparison and for users who want exactly its warmup (strategy ``reference``).

Its generator takes ``(min, step, max, limit)``: ``limit`` geometric points from
``step`` (when ``min`` is 0 or 1, ``min`` itself is kept as a value of its own) or
from ``min`` up to ``max``, each rounded up to a multiple of ``step``; duplicates go
and the last value is capped at ``max``. Every dimension's values are combined.
"""

import math

from vllm_hpu.bucketing.buckets import Bucket
from vllm_hpu.bucketing.config import BucketingConfig

# Its decode block ladder reaches this many times the KV cache's blocks.
DECODE_BLOCK_FACTOR = 3


def reference_range(low: int, step: int, high: int, limit: int) -> list[int]:
    """``(128, 128, 2048, 10)`` -> 128, 256, 384, 512, 640, 896, 1152, 1536, 2048."""
    if limit < 1 or step < 1 or low > high:
        raise ValueError(f"invalid reference range {(low, step, high, limit)}")
    if limit == 1:
        return [high]
    values = {low} if low in (0, 1) else set()
    start = step if low in (0, 1) else low
    for i in range(limit):
        point = start * (high / start) ** (i / (limit - 1))
        values.add(math.ceil(point / step - 1e-9) * step)
    ordered = sorted(values)
    ordered[-1] = min(ordered[-1], high)
    return sorted(set(ordered))


def log2_limit(high: int) -> int:
    """One point per doubling of ``high``, plus one: the reference's usual limit."""
    return math.ceil(math.log2(max(high, 2))) + 1


def reference_prompt_buckets(config: BucketingConfig) -> list[Bucket]:
    """One prompt per pass; query up to the token budget; context on a ladder."""
    block_size = config.block_size
    # One point per doubling of the budget, less one (10 for 2048 tokens).
    query_limit = log2_limit(config.max_num_batched_tokens) - 2
    query_lens = reference_range(
        block_size, block_size, config.max_num_batched_tokens, query_limit
    )
    contexts = [0]
    if config.use_context_buckets:
        max_context = max(1, (config.max_model_len - block_size) // block_size)
        contexts = reference_range(0, 1, max_context, log2_limit(max_context))
    return [Bucket(1, q, c) for q in query_lens for c in contexts]


def reference_decode_buckets(
    config: BucketingConfig, num_kv_blocks: int
) -> list[Bucket]:
    """Batch ``(1, 2, max_num_seqs)``; blocks ``(1, max_num_seqs, 3 x KV blocks)``,
    each clamped to what the batch can hold at ``max_model_len``."""
    seqs = config.max_num_seqs
    batch_sizes = reference_range(1, 2, seqs, log2_limit(seqs))
    block_max = DECODE_BLOCK_FACTOR * num_kv_blocks
    ladder = reference_range(1, seqs, block_max, log2_limit(block_max))
    blocks_per_seq = math.ceil(config.max_model_len / config.block_size)
    buckets = {
        Bucket(bs, 1, min(blocks, bs * blocks_per_seq))
        for bs in batch_sizes
        for blocks in ladder
        if blocks >= bs
    }
    return sorted(buckets)
