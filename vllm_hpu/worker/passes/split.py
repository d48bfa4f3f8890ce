"""Merged prefill: a step's prompt chunks packed into one flat sequence per pass,
padded to a ``(1, total tokens, total context blocks)`` bucket; token ``t`` of
chunk ``i`` sits at the chunk's offset in the pack. The unpacked (one row per
prompt) passes of ``worker/inputs.py`` stay for ``VLLM_HPU_MERGED_PREFILL=false``
and pooling models, chosen at start-up in ``BucketingConfig``.
"""

import numpy as np
import torch

from vllm_hpu.attention.merged import (
    build_merged_prompt_metadata,
    packed_context_blocks,
    packed_tokens,
)
from vllm_hpu.attention.metadata import CacheGeometry, SeqLayout
from vllm_hpu.bucketing import Bucket, HpuBucketManager
from vllm_hpu.worker.passes.build import (
    ForwardPass,
    ScheduledSeq,
    build_prompt_pass,
    context_blocks,
    split_prefills,
)


def pass_shape(
    seqs: list[ScheduledSeq], merged: bool, block_size: int
) -> tuple[int, int, int]:
    """(rows, query length, context blocks) a prompt pass over ``seqs`` pads up."""
    if merged:
        layouts = [s.layout for s in seqs]
        return 1, packed_tokens(layouts), packed_context_blocks(layouts, block_size)
    return (
        len(seqs),
        max(s.layout.num_scheduled_tokens for s in seqs),
        max(context_blocks(s, block_size) for s in seqs),
    )


def split_merged(
    seqs: list[ScheduledSeq], buckets: HpuBucketManager, block_size: int
) -> list[list[ScheduledSeq]]:
    """Packs, first fit: a chunk joins the first pack that still has a warmed-up
    bucket with it (the step's tokens always fit one; context may not). A chunk
    reading blocks another chunk of its pack writes is fine: every layer writes
    the pass's KV before it gathers context."""
    packs: list[list[ScheduledSeq]] = []
    for seq in seqs:
        for pack in packs:
            if buckets.has_prompt_bucket(*pass_shape([*pack, seq], True, block_size)):
                pack.append(seq)
                break
        else:
            packs.append([seq])
    return packs


def split_prompt_passes(
    seqs: list[ScheduledSeq],
    max_num_tokens: int,
    buckets: HpuBucketManager,
    block_size: int,
) -> list[list[ScheduledSeq]]:
    """The step's prompt passes, packed or one row per chunk."""
    if buckets.config.merged_prefill:
        return split_merged(seqs, buckets, block_size)
    return split_prefills(seqs, max_num_tokens, buckets, block_size)


def build_merged_pass(
    seqs: list[ScheduledSeq],
    buckets: HpuBucketManager,
    token_ids: np.ndarray,
    cache: CacheGeometry,
) -> ForwardPass:
    """One packed prompt pass; ``token_ids`` is InputBatch.token_ids_cpu."""
    bucket = buckets.find_prompt_bucket(*pass_shape(seqs, True, cache.block_size))
    input_ids = np.zeros(bucket.query_len, dtype=np.int64)
    positions = np.zeros_like(input_ids)
    first_token_indices, offset = [], 0
    for seq in seqs:
        end = offset + seq.layout.num_scheduled_tokens
        input_ids[offset:end] = token_ids[seq.row, seq.start : seq.end]
        positions[offset:end] = np.arange(seq.start, seq.end)
        first_token_indices.append(offset)
        offset = end
    metadata = build_merged_prompt_metadata(
        [s.layout for s in seqs], bucket.query_len, bucket.num_blocks, cache
    )
    return ForwardPass(
        is_prompt=True,
        bucket=bucket,
        seqs=seqs,
        input_ids=torch.from_numpy(input_ids).to(cache.device),
        positions=torch.from_numpy(positions).to(cache.device),
        attn_metadata=metadata,
        first_token_indices=first_token_indices,
    )


def build_prompt_forward(
    seqs: list[ScheduledSeq],
    buckets: HpuBucketManager,
    token_ids: np.ndarray,
    cache: CacheGeometry,
) -> ForwardPass:
    if buckets.config.merged_prefill:
        return build_merged_pass(seqs, buckets, token_ids, cache)
    return build_prompt_pass(seqs, buckets, token_ids, cache)


def merged_fake_chunks(
    bucket: Bucket, context_blocks: int, block_size: int, max_len: int
) -> list[tuple[int, int]]:
    """(total tokens, cached tokens) of requests whose chunks pack into
    ``bucket.query_len`` tokens over ``context_blocks`` whole context blocks, each
    request within ``max_len`` tokens and computing at least 2 (warmup's seqs)."""
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


def profile_seqs(
    bucket: Bucket, merged: bool, block_size: int, max_len: int
) -> list[ScheduledSeq]:
    """Chunks filling a context-free prompt bucket for the memory profile: its
    rows, or packed requests of at most ``max_len`` tokens; every slot in block 0
    (the profile's scratch cache has one block)."""
    if merged:
        lengths = [n for n, _ in merged_fake_chunks(bucket, 0, block_size, max_len)]
    else:
        lengths = [bucket.query_len] * bucket.batch_size
    return [
        ScheduledSeq(
            row=0,
            layout=SeqLayout([0] * -(-length // block_size), 0, length),
        )
        for length in lengths
    ]
