"""Padded forward passes for one engine step: prompt batches and one decode batch.

Each pass is padded to a bucket so that the device sees only pre-compiled shapes.
Token ``t`` of prompt row ``i`` sits at flat index ``i * query_len + t``; decode
row ``i`` at index ``i``. Padding tokens are id 0 at position 0 and write their
KV into the dummy block (see ``attention/metadata.py``).
"""

from dataclasses import dataclass

import numpy as np
import torch

from vllm_hpu.attention.metadata import (
    CacheGeometry,
    HpuAttentionMetadata,
    SeqLayout,
    build_decode_metadata,
    build_prompt_metadata,
)
from vllm_hpu.bucketing import Bucket, HpuBucketManager


@dataclass(frozen=True)
class ScheduledSeq:
    row: int  # the request's row in vLLM's InputBatch
    layout: SeqLayout

    @property
    def start(self) -> int:
        return self.layout.num_computed_tokens

    @property
    def end(self) -> int:
        return self.layout.num_computed_tokens + self.layout.num_scheduled_tokens


@dataclass
class ForwardPass:
    is_prompt: bool
    bucket: Bucket
    seqs: list[ScheduledSeq]
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    attn_metadata: HpuAttentionMetadata
    first_token_indices: list[int]  # flat index of each seq's first scheduled token

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def last_token_indices(self) -> list[int]:
        return [
            first + seq.layout.num_scheduled_tokens - 1
            for first, seq in zip(self.first_token_indices, self.seqs, strict=True)
        ]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def context_blocks(seq: ScheduledSeq, block_size: int) -> int:
    return _cdiv(seq.layout.num_computed_tokens, block_size)


def split_prefills(
    seqs: list[ScheduledSeq], max_num_tokens: int
) -> list[list[ScheduledSeq]]:
    """Group prompt chunks so that rows x longest chunk fits the token budget.

    vLLM bounds only the sum of real tokens; prompt buckets are generated for
    batches within this bound, so every group finds a warmed-up bucket.
    """
    batches: list[list[ScheduledSeq]] = []
    current: list[ScheduledSeq] = []
    longest = 0
    for seq in seqs:
        query_len = seq.layout.num_scheduled_tokens
        if current and (len(current) + 1) * max(longest, query_len) > max_num_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(seq)
        longest = max(longest, query_len)
    if current:
        batches.append(current)
    return batches


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(array).to(device)


def build_prompt_pass(
    seqs: list[ScheduledSeq],
    buckets: HpuBucketManager,
    token_ids: np.ndarray,
    cache: CacheGeometry,
) -> ForwardPass:
    """A prompt pass over ``seqs``; ``token_ids`` is InputBatch.token_ids_cpu."""
    bucket = buckets.find_prompt_bucket(
        len(seqs),
        max(s.layout.num_scheduled_tokens for s in seqs),
        max(context_blocks(s, cache.block_size) for s in seqs),
    )
    input_ids = np.zeros((bucket.batch_size, bucket.query_len), dtype=np.int64)
    positions = np.zeros_like(input_ids)
    for i, seq in enumerate(seqs):
        count = seq.layout.num_scheduled_tokens
        input_ids[i, :count] = token_ids[seq.row, seq.start : seq.end]
        positions[i, :count] = np.arange(seq.start, seq.end)
    metadata = build_prompt_metadata(
        [s.layout for s in seqs],
        bucket.batch_size,
        bucket.query_len,
        bucket.num_blocks,
        cache,
    )
    return ForwardPass(
        is_prompt=True,
        bucket=bucket,
        seqs=seqs,
        input_ids=_to_device(input_ids.reshape(-1), cache.device),
        positions=_to_device(positions.reshape(-1), cache.device),
        attn_metadata=metadata,
        first_token_indices=[i * bucket.query_len for i in range(len(seqs))],
    )


def build_decode_pass(
    seqs: list[ScheduledSeq],
    buckets: HpuBucketManager,
    token_ids: np.ndarray,
    cache: CacheGeometry,
) -> ForwardPass:
    """A decode pass: one new token per seq, attending over its paged blocks."""
    num_blocks = sum(_cdiv(s.end, cache.block_size) for s in seqs)
    bucket = buckets.find_decode_bucket(len(seqs), num_blocks)
    input_ids = np.zeros(bucket.batch_size, dtype=np.int64)
    positions = np.zeros_like(input_ids)
    rows = np.array([s.row for s in seqs])
    starts = np.array([s.start for s in seqs])
    input_ids[: len(seqs)] = token_ids[rows, starts]
    positions[: len(seqs)] = starts
    metadata = build_decode_metadata(
        [s.layout for s in seqs], bucket.batch_size, bucket.num_blocks, cache
    )
    return ForwardPass(
        is_prompt=False,
        bucket=bucket,
        seqs=seqs,
        input_ids=_to_device(input_ids, cache.device),
        positions=_to_device(positions, cache.device),
        attn_metadata=metadata,
        first_token_indices=list(range(len(seqs))),
    )
