"""The reference Gaudi plugin's default buckets, reproduced from its code
(vllm-gaudi 091bbadd, ``vllm_gaudi/extension/bucketing``): strategy
``reference`` (one prompt per pass) and ``reference-merged`` (its merged
prefill). Like the reference, decode blocks count as contiguous paged attention
does without prefix caching, as block references (up to 3 x the KV cache) with."""

import dataclasses
import math

from vllm_hpu.bucketing.buckets import Bucket
from vllm_hpu.bucketing.settings import BucketingConfig

# From this max_model_len the prompt context ladder ends at the context the
# token budget leaves, and each query length gets the most context it can have.
LONG_CONTEXT_LEN = 8192
# Without contiguous PA, decode block references may reach this many times the
# KV cache's blocks (prefix-cache hits count a shared block once per sequence).
DECODE_BLOCK_FACTOR = 3
# Merged prefill: the query and context ladders' steps, in blocks.
MERGED_QUERY_BLOCKS = 4
MERGED_CONTEXT_STEP = 4


def reference_range(
    low: int, step: int, high: int, limit: int, exact_last: bool = False
) -> list[int]:
    """Its ``(min, step, max, limit)`` generator: as ``ranges.geometric_range``, but
    the last point exactly ``max`` with ``exact_last`` (contiguous PA), in its own
    float arithmetic so values agree to the last rounding: ``(128, 128, 2048,
    10)`` -> 128, 256, 384, 512, 640, 896, 1152, 1536, 2048."""
    if limit < 1 or step < 1:
        raise ValueError(f"invalid reference range {(low, step, high, limit)}")
    if limit == 1:
        return [high]
    values = {low} if low in (0, 1) else set()
    start = step if low in (0, 1) else low
    for i in range(limit):
        point = start * (high / start) ** ((1.0 / (limit - 1)) * i)
        last = exact_last and i == limit - 1
        values.add(high if last else math.ceil(point / step) * step)
    ordered = sorted(values)
    ordered[-1] = min(ordered[-1], high)
    return sorted(set(ordered))


def log2_limit(high: int) -> int:
    """Its usual limit: ``ceil(log2(max)) + 1`` points."""
    return math.ceil(math.log2(high)) + 1


@dataclasses.dataclass(frozen=True)
class PromptRanges:
    """Each prompt dimension's values, and what a bucket must satisfy."""

    queries: list[int]
    contexts: list[int]
    # Prompts a pass may hold: 1, or max_num_seqs when merged.
    prefill_seqs: int
    merged: bool


def prompt_ranges(config: BucketingConfig, merged: bool) -> PromptRanges:
    block_size, budget = config.block_size, config.max_num_batched_tokens
    exact_last = not config.prefix_caching  # contiguous PA
    if config.max_model_len >= LONG_CONTEXT_LEN:
        max_context = max(1, (config.max_model_len - budget) // block_size)
    else:
        max_context = max(1, (config.max_model_len - block_size) // block_size)
    context_limit = log2_limit(max_context) if max_context > 1 else 2
    query_limit = math.ceil(math.log2(budget))
    prefill_seqs = config.max_num_seqs if merged else 1
    query_step = MERGED_QUERY_BLOCKS * block_size if merged else block_size
    context = (
        (MERGED_CONTEXT_STEP, max_context * prefill_seqs)
        if merged
        else (1, max_context)
    )
    return PromptRanges(
        reference_range(block_size, query_step, budget, query_limit, exact_last),
        reference_range(0, *context, context_limit, exact_last),
        prefill_seqs,
        merged,
    )


def keeps_prompt(
    config: BucketingConfig, ranges: PromptRanges, query: int, ctx: int
) -> bool:
    """Its prompt filters: merged, context within what the pass's prompts can
    hold; otherwise query and context within max_model_len and the budget."""
    max_len, block_size = config.max_model_len, config.block_size
    if ranges.merged:
        seqs = ranges.prefill_seqs
        return ctx <= seqs * ((max_len - query // seqs) // block_size)
    most_context = math.ceil((max_len - 1) / block_size)
    fits_len = ctx <= most_context and query <= max_len
    return fits_len and query <= config.max_num_batched_tokens


def reference_prompt_buckets(config: BucketingConfig, merged: bool) -> list[Bucket]:
    """Every query with every context, batch size 1; with long context the largest is
    cut per query to what it leaves room for (else the previous query's)."""
    ranges = prompt_ranges(config, merged)
    long_context = config.max_model_len >= LONG_CONTEXT_LEN
    largest = max(ranges.contexts)
    buckets = set()
    for context in ranges.contexts:
        ctx = context
        for query in ranges.queries:
            if long_context and context == largest:
                edge = (config.max_model_len - query) // config.block_size
                ctx = edge if edge >= 0 else ctx
            if keeps_prompt(config, ranges, query, ctx):
                buckets.add(Bucket(1, query, ctx))
    return _non_empty(sorted(buckets), "prompt")


def reference_decode_buckets(
    config: BucketingConfig, num_kv_blocks: int
) -> list[Bucket]:
    """Batch sizes ``(1, 2, max_num_seqs)`` x blocks ``(1, max_num_seqs, most)``, most
    3 x the KV cache's blocks with prefix caching (clamped to what the batch holds
    at max_model_len; counts below the batch go), else the KV cache."""
    seqs = config.max_num_seqs
    contiguous = not config.prefix_caching
    blocks_per_seq = math.ceil(config.max_model_len / config.block_size)
    most = blocks_per_seq * seqs
    most = min(
        most, num_kv_blocks if contiguous else DECODE_BLOCK_FACTOR * num_kv_blocks
    )
    batch_sizes = reference_range(1, 2, seqs, log2_limit(seqs), contiguous)
    ladder = reference_range(1, seqs, most, log2_limit(most), contiguous)
    if contiguous:
        if ladder[-1] < num_kv_blocks:
            ladder.append(num_kv_blocks)
        return sorted(
            {Bucket(bs, 1, blocks) for bs in batch_sizes for blocks in ladder}
        )
    buckets = {
        Bucket(bs, 1, min(blocks, bs * blocks_per_seq))
        for bs in batch_sizes
        for blocks in ladder
        if blocks >= bs
    }
    return _non_empty(sorted(buckets), "decode")


def _non_empty(buckets: list[Bucket], phase: str) -> list[Bucket]:
    """The reference refuses to start without buckets; so does this strategy."""
    if not buckets:
        raise ValueError(
            f"The reference's {phase} buckets are empty for this configuration (its "
            "filters drop every one, and the reference refuses to start too): raise "
            "max_model_len or max_num_batched_tokens, or pick another "
            "VLLM_HPU_BUCKETING_STRATEGY."
        )
    return buckets
