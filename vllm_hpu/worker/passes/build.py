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


def _prompt_shape(seqs: list[ScheduledSeq], block_size: int) -> tuple[int, int, int]:
    """(rows, longest chunk, most context blocks): what a prompt pass pads up."""
    return (
        len(seqs),
        max(s.layout.num_scheduled_tokens for s in seqs),
        max(context_blocks(s, block_size) for s in seqs),
    )


def _prompt_tokens(
    seqs: list[ScheduledSeq], buckets: HpuBucketManager, block_size: int
) -> int:
    """Tokens ``seqs`` run as in one prompt pass, padded to its bucket."""
    bucket = buckets.covering_prompt_bucket(*_prompt_shape(seqs, block_size))
    return bucket.batch_size * bucket.query_len


def _dependency_depths(seqs: list[ScheduledSeq], block_size: int) -> list[int]:
    """How many passes must run before each chunk.

    vLLM can hand a prompt, as cached context, full blocks that another prompt
    scheduled in the same step writes (identical prefixes arriving together): the
    reader must run in a later pass than the writer. One pass is fine too, since
    every layer writes the pass's KV before reading context, but reordering chunks
    by length must not put a reader first.
    """
    writers: dict[int, int] = {}
    for index, seq in enumerate(seqs):
        table = seq.layout.block_table
        for block in table[seq.start // block_size : _cdiv(seq.end, block_size)]:
            writers[block] = index
    depths: dict[int, int] = {}

    def depth(index: int) -> int:
        if index not in depths:
            seq = seqs[index]
            context = seq.layout.block_table[: context_blocks(seq, block_size)]
            sources = {writers.get(block, index) for block in context} - {index}
            depths[index] = max((depth(w) + 1 for w in sources), default=0)
        return depths[index]

    return [depth(index) for index in range(len(seqs))]


def split_prefills(
    seqs: list[ScheduledSeq],
    max_num_tokens: int,
    buckets: HpuBucketManager,
    block_size: int,
) -> list[list[ScheduledSeq]]:
    """Group prompt chunks into passes of similar length.

    Chunks are taken shortest first (then least cached context), after every chunk
    whose cached context they read is written (see ``_dependency_depths``). The
    next chunk joins the current pass unless rows x longest chunk would exceed the
    token budget (vLLM bounds only the sum of real tokens; prompt buckets are
    generated for batches within this bound, so every pass finds a warmed-up
    bucket), or has no warmed-up bucket (a bucket set need not have every batch
    size), or unless the joined pass would be padded to more tokens than the two
    passes apart, counting starting a pass as one block of tokens (the smallest
    prompt bucket by default): a long chunk must not stretch every short row.
    """
    depths = _dependency_depths(seqs, block_size)
    batches: list[list[ScheduledSeq]] = []
    for level in sorted(set(depths)):
        ready = [seq for seq, d in zip(seqs, depths, strict=True) if d == level]
        batches += _group_by_length(ready, max_num_tokens, buckets, block_size)
    return batches


def _group_by_length(
    seqs: list[ScheduledSeq],
    max_num_tokens: int,
    buckets: HpuBucketManager,
    block_size: int,
) -> list[list[ScheduledSeq]]:
    batches: list[list[ScheduledSeq]] = []
    current: list[ScheduledSeq] = []
    by_length = sorted(
        seqs,
        key=lambda s: (s.layout.num_scheduled_tokens, s.layout.num_computed_tokens),
    )
    for seq in by_length:
        joined = [*current, seq]
        if current and (
            len(joined) * seq.layout.num_scheduled_tokens > max_num_tokens
            or not buckets.has_prompt_bucket(*_prompt_shape(joined, block_size))
            or _prompt_tokens(joined, buckets, block_size)
            > _prompt_tokens(current, buckets, block_size)
            + _prompt_tokens([seq], buckets, block_size)
            + block_size
        ):
            batches.append(current)
            joined = [seq]
        current = joined
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
    bucket = buckets.find_prompt_bucket(*_prompt_shape(seqs, cache.block_size))
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
