"""The bucket sets: every ``(batch_size, query_len, num_blocks)`` worth compiling;
kept only if the smallest request within vLLM's limits is padded to it."""

import math
from typing import NamedTuple

from vllm_hpu.bucketing.ranges import BucketRange, exponential_range, linear_range
from vllm_hpu.bucketing.settings import BucketingConfig


class Bucket(NamedTuple):
    """One compiled shape. Decode: ``query_len == 1``, ``num_blocks`` the padded P;
    prompt: ``num_blocks`` the padded cached-context blocks (0: none)."""

    batch_size: int
    query_len: int
    num_blocks: int


class PromptDims(NamedTuple):
    """The sorted values of each prompt dimension, before filtering."""

    batch_sizes: list[int]
    query_lens: list[int]
    context_blocks: list[int]


class DecodeDims(NamedTuple):
    """The sorted values of each decode dimension, before clamping."""

    batch_sizes: list[int]
    num_blocks: list[int]


def dimension_values(bucket_range: BucketRange, exponential: bool) -> list[int]:
    """A dimension's values under the configured spacing."""
    return (
        exponential_range(bucket_range) if exponential else linear_range(bucket_range)
    )


def prompt_dims(config: BucketingConfig) -> PromptDims:
    """Prompts without cached context are the common case: 0 is always a value."""
    return PromptDims(
        dimension_values(config.prompt_bs, config.exponential),
        dimension_values(config.prompt_seq, config.exponential),
        sorted({0, *dimension_values(config.prompt_block, config.exponential)}),
    )


def decode_dims(config: BucketingConfig) -> DecodeDims:
    values = [
        dimension_values(r, config.exponential)
        for r in (config.decode_bs, config.decode_block)
    ]
    return DecodeDims(*values)


def smallest_padded(values: list[int], floor: int) -> list[int]:
    """For each sorted value, the smallest real value padded to it (``floor`` first)."""
    return [floor] + [previous + 1 for previous in values[:-1]]


def fillable_batch_sizes(batch_sizes: list[int], num_kv_blocks: int) -> list[int]:
    """The sorted batch sizes some batch the KV cache can hold pads to: each
    decoding sequence needs a block of its own (the smallest size always stays)."""
    lowest = smallest_padded(batch_sizes, 1)
    pairs = zip(batch_sizes, lowest, strict=True)
    fillable = [size for size, low in pairs if low <= num_kv_blocks]
    return fillable or batch_sizes[:1]


def context_tokens(min_blocks: int, block_size: int) -> int:
    """The fewest cached tokens that occupy ``min_blocks`` blocks."""
    return 0 if min_blocks == 0 else (min_blocks - 1) * block_size + 1


def generate_prompt_buckets(config: BucketingConfig) -> list[Bucket]:
    """Prompt buckets some legal request needs: rows <= ``max_num_seqs``, ``bs *
    query_len <= max_num_batched_tokens``, ``context + query_len <= max_model_len``."""
    dims = prompt_dims(config)
    min_batch = smallest_padded(dims.batch_sizes, 1)
    min_query = smallest_padded(dims.query_lens, 1)
    min_context = smallest_padded(dims.context_blocks, 0)
    buckets = []
    for batch_size, low_batch in zip(dims.batch_sizes, min_batch, strict=True):
        for query_len, low_query in zip(dims.query_lens, min_query, strict=True):
            if low_batch > config.max_num_seqs:
                continue
            if low_batch * low_query > config.max_num_batched_tokens:
                continue
            for blocks, low_blocks in zip(
                dims.context_blocks, min_context, strict=True
            ):
                low_context = context_tokens(low_blocks, config.block_size)
                if low_query + low_context <= config.max_model_len:
                    buckets.append(Bucket(batch_size, query_len, blocks))
    return buckets


def max_blocks_per_seq(config: BucketingConfig) -> int:
    return math.ceil(config.max_model_len / config.block_size)


def decode_block_cap(
    config: BucketingConfig, batch_size: int, num_kv_blocks: int
) -> int:
    """The most blocks ``batch_size`` sequences can hold: KV capacity, max_model_len."""
    return min(num_kv_blocks, batch_size * max_blocks_per_seq(config))


def generate_decode_buckets(
    config: BucketingConfig, num_kv_blocks: int
) -> list[Bucket]:
    """Decode buckets, block counts clamped (not dropped) to what the batch can hold;
    counts below the batch size go, since every sequence holds a block."""
    dims = decode_dims(config)
    min_batch = smallest_padded(dims.batch_sizes, 1)
    buckets: list[Bucket] = []
    for batch_size, low_batch in zip(dims.batch_sizes, min_batch, strict=True):
        if low_batch > config.max_num_seqs:
            continue
        cap = decode_block_cap(config, batch_size, num_kv_blocks)
        clamped = sorted(
            {min(blocks, cap) for blocks in dims.num_blocks if blocks >= low_batch}
        )
        buckets.extend(Bucket(batch_size, 1, blocks) for blocks in clamped)
    return buckets
