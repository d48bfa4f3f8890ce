"""Which generator makes each phase's buckets: the strategy the config resolved."""

import math

from vllm_hpu.bucketing.bucket_file import read_bucket_file
from vllm_hpu.bucketing.buckets import (
    Bucket,
    fillable_batch_sizes,
    generate_decode_buckets,
    generate_prompt_buckets,
)
from vllm_hpu.bucketing.compact import compact_decode_buckets, compact_prompt_buckets
from vllm_hpu.bucketing.long_context import (
    is_long_context,
    long_context_decode_buckets,
    long_context_prompt_buckets,
)
from vllm_hpu.bucketing.merged_buckets import merged_prompt_buckets, single_row_buckets
from vllm_hpu.bucketing.reference import (
    reference_decode_buckets,
    reference_prompt_buckets,
)
from vllm_hpu.bucketing.settings import BucketingConfig

# Strategies whose values come from the (min, step, max) ranges.
RANGE_STRATEGIES = ("linear", "exponential")


def strategy_prompt_buckets(config: BucketingConfig) -> list[Bucket]:
    strategy = config.prompt_strategy
    if not config.merged_prefill or strategy == "reference-merged":
        return _prompt_buckets(config)
    if strategy == "compact" and is_long_context(config):
        return long_context_prompt_buckets(config)
    if strategy == "compact":
        return merged_prompt_buckets(config)
    return single_row_buckets(_prompt_buckets(config), strategy)


def _prompt_buckets(config: BucketingConfig) -> list[Bucket]:
    strategy = config.prompt_strategy
    if strategy in RANGE_STRATEGIES:
        return generate_prompt_buckets(config)
    if strategy == "compact":
        return compact_prompt_buckets(config)
    if strategy in ("reference", "reference-merged"):
        return reference_prompt_buckets(config, merged=strategy == "reference-merged")
    return read_bucket_file(config.bucket_file).prompt


def strategy_decode_buckets(
    config: BucketingConfig, num_kv_blocks: int
) -> list[Bucket]:
    """The strategy's decode buckets, less batch sizes the KV cache cannot fill.
    The reference strategies keep the reference's own lists as they are."""
    buckets = _decode_buckets(config, num_kv_blocks)
    if config.decode_strategy in ("reference", "reference-merged"):
        return buckets
    return drop_unfillable_batches(buckets, num_kv_blocks)


def drop_unfillable_batches(buckets: list[Bucket], num_kv_blocks: int) -> list[Bucket]:
    """Buckets of batch sizes only batches larger than the KV cache can hold
    pad to are never used (and warming one would run a smaller batch)."""
    batch_sizes = sorted({bucket.batch_size for bucket in buckets})
    fillable = set(fillable_batch_sizes(batch_sizes, num_kv_blocks))
    return [b for b in buckets if b.batch_size in fillable]


def _decode_buckets(config: BucketingConfig, num_kv_blocks: int) -> list[Bucket]:
    strategy = config.decode_strategy
    if strategy in RANGE_STRATEGIES:
        return generate_decode_buckets(config, num_kv_blocks)
    if strategy == "compact" and is_long_context(config):
        return long_context_decode_buckets(config, num_kv_blocks)
    if strategy == "compact":
        return compact_decode_buckets(config, num_kv_blocks)
    if strategy in ("reference", "reference-merged"):
        return reference_decode_buckets(config, num_kv_blocks)
    return clamp_decode_buckets(
        config, read_bucket_file(config.bucket_file).decode, num_kv_blocks
    )


def clamp_decode_buckets(
    config: BucketingConfig, buckets: list[Bucket], num_kv_blocks: int
) -> list[Bucket]:
    """Block counts no batch can reach are clamped to what it can hold."""
    blocks_per_seq = math.ceil(config.max_model_len / config.block_size)
    clamped = {
        b._replace(
            num_blocks=min(b.num_blocks, num_kv_blocks, b.batch_size * blocks_per_seq)
        )
        for b in buckets
    }
    return sorted(clamped)
