"""Scheduled seqs made up to fill a bucket exactly: the memory profile's run and
warmup's packed requests (real steps never come through here)."""

from vllm.utils.math_utils import cdiv

from vllm_hpu.attention.metadata import SeqLayout
from vllm_hpu.bucketing import Bucket, HpuBucketManager
from vllm_hpu.worker.passes.seqs import ScheduledSeq


def merged_fake_chunks(
    bucket: Bucket, context_blocks: int, block_size: int, max_len: int
) -> list[tuple[int, int]]:
    """(total, cached) tokens of requests packing into ``bucket.query_len`` over
    ``context_blocks`` whole blocks, each <= ``max_len`` and computing >= 2."""
    chunks: list[tuple[int, int]] = []
    tokens, blocks = bucket.query_len, context_blocks
    while tokens > 0:
        own_blocks = min(blocks, max(0, (max_len - 2) // block_size))
        cached = own_blocks * block_size
        query = min(tokens, max_len - cached)
        if tokens - query == 1:  # the last chunk would be a one-token decode
            query -= 1
        if query < 2:
            return []
        chunks.append((cached + query, cached))
        tokens, blocks = tokens - query, blocks - own_blocks
    return chunks if blocks == 0 else []


def largest_prompt_bucket(buckets: HpuBucketManager) -> Bucket:
    """The context-free prompt bucket of the most tokens (the memory profile's)."""
    return max(
        (b for b in buckets.prompt_buckets if b.num_blocks == 0),
        key=lambda b: (b.batch_size * b.query_len, b.query_len),
    )


def profile_seqs(
    bucket: Bucket, merged: bool, block_size: int, max_len: int
) -> list[ScheduledSeq]:
    """Chunks filling a context-free prompt bucket for the memory profile (rows, or
    packs of <= ``max_len``); all slots in block 0, the scratch cache's only block."""
    if merged:
        lengths = [n for n, _ in merged_fake_chunks(bucket, 0, block_size, max_len)]
    else:
        lengths = [bucket.query_len] * bucket.batch_size
    return [
        ScheduledSeq(
            row=0,
            layout=SeqLayout([0] * cdiv(length, block_size), 0, length),
        )
        for length in lengths
    ]
