"""Metadata of a verification pass: each row's ``q <= Q`` tokens (its last
sampled token and its drafts) against its cached blocks in the flat decode
layout, causal among the row's own tokens.

The pass is a decode pass of ``bs`` rows with ``Q`` query tokens each, row
``i``'s token ``j`` at flat index ``i * Q + j``. Its keys and values are written
first (``slot_mapping``, as decode does), so each query reads its own row's new
tokens from the cache: query ``j`` of a row with context ``c`` sees key
positions up to ``c + j`` (within its window or chunk). Padding queries of a
short row repeat its last query; padding rows and blocks are decode's.
"""

from dataclasses import dataclass, field

import numpy as np
import torch
from vllm.utils.math_utils import cdiv

from vllm_hpu.attention.metadata import (
    CacheGeometry,
    HpuAttentionMetadata,
    SeqLayout,
    first_visible_position,
    window_capacity,
)
from vllm_hpu.ops.paged_attention import DecodeBlocks


def query_positions(seq: SeqLayout, num_queries: int) -> np.ndarray:
    """[Q] the position each query of the row stands at (padding: the last)."""
    last = seq.num_scheduled_tokens - 1
    return seq.num_computed_tokens + np.minimum(np.arange(num_queries), last)


def _first_visible(
    positions: np.ndarray, window: int | None, chunk: int | None
) -> np.ndarray:
    return np.array([first_visible_position(int(p), window, chunk) for p in positions])


@dataclass
class _VerifyBlocks:
    """Per flat block: physical id, row, key offset; per block and query the
    visible slot range [start, usage)."""

    block_size: int
    num_queries: int
    block_list: list[np.ndarray] = field(default_factory=list)
    block_groups: list[np.ndarray] = field(default_factory=list)
    block_offsets: list[np.ndarray] = field(default_factory=list)
    block_start: list[np.ndarray] = field(default_factory=list)  # [n, Q]
    block_usage: list[np.ndarray] = field(default_factory=list)  # [n, Q]

    @property
    def num_blocks(self) -> int:
        return sum(len(ids) for ids in self.block_list)

    def add_row(
        self, row: int, seq: SeqLayout, window: int | None, chunk: int | None
    ) -> None:
        """The blocks from the first query's first visible key to the last
        query's own, each query seeing up to its own position."""
        positions = query_positions(seq, self.num_queries)
        starts = _first_visible(positions, window, chunk)
        first = int(starts.min()) // self.block_size
        end = cdiv(int(positions.max()) + 1, self.block_size)
        keys = np.arange(first, end, dtype=np.int64)[:, None] * self.block_size
        self.block_list.append(np.asarray(seq.block_table[first:end], dtype=np.int64))
        self.block_groups.append(np.full(end - first, row, dtype=np.int64))
        self.block_offsets.append(keys[:, 0] - seq.num_computed_tokens)
        self.block_start.append(np.maximum(starts[None, :] - keys, 0))
        self.block_usage.append(
            np.clip(positions[None, :] + 1 - keys, 0, self.block_size)
        )

    def pad(self, count: int, batch_size: int, dummy_block: int) -> None:
        """Padding blocks read the dummy block for the sink row, one token each."""
        for values, fill in (
            (self.block_list, dummy_block),
            (self.block_groups, batch_size),
            (self.block_offsets, 0),
        ):
            values.append(np.full(count, fill, dtype=np.int64))
        self.block_start.append(np.zeros((count, self.num_queries), dtype=np.int64))
        self.block_usage.append(np.ones((count, self.num_queries), dtype=np.int64))


def _verify_slots(
    seqs: list[SeqLayout], batch_size: int, num_queries: int, cache: CacheGeometry
) -> torch.Tensor:
    """[bs * Q] cache slot of every token; padding spreads over the dummy block."""
    block_size = cache.block_size
    index = np.arange(batch_size * num_queries)
    slots = cache.num_blocks * block_size + index % block_size
    for i, seq in enumerate(seqs):
        table = np.asarray(seq.block_table, dtype=np.int64)
        positions = seq.num_computed_tokens + np.arange(seq.num_scheduled_tokens)
        start = i * num_queries
        slots[start : start + len(positions)] = (
            table[positions // block_size] * block_size + positions % block_size
        )
    return torch.from_numpy(slots).to(cache.device)


def build_verify_metadata(
    seqs: list[SeqLayout],
    batch_size: int,
    num_queries: int,
    num_blocks: int,
    cache: CacheGeometry,
) -> HpuAttentionMetadata:
    """Metadata of a verification pass of ``batch_size`` rows of
    ``num_queries`` (Q) tokens over ``num_blocks`` (P) flat blocks, one layout
    per sliding window and attention chunk size, as decode's."""
    if len(seqs) > batch_size:
        raise ValueError(f"{len(seqs)} sequences do not fit batch size {batch_size}")
    too_long = [
        s.num_scheduled_tokens for s in seqs if s.num_scheduled_tokens > num_queries
    ]
    if too_long:
        raise ValueError(
            f"{too_long[0]} tokens do not fit {num_queries} queries per row"
        )
    windows: list[int | None] = [None] if cache.full_attention else []
    windows += cache.sliding_windows

    def layout(window: int | None, chunk: int | None = None) -> DecodeBlocks:
        flat = _VerifyBlocks(cache.block_size, num_queries)
        for i, seq in enumerate(seqs):
            flat.add_row(i, seq, window, chunk)
        span = window if chunk is None else chunk
        if span is not None:  # the queries widen a window by Q - 1 keys
            span += num_queries - 1
        capacity = window_capacity(num_blocks, batch_size, span, cache.block_size)
        if flat.num_blocks > capacity:
            raise ValueError(
                f"verification batch needs {flat.num_blocks} blocks but "
                f"num_blocks={num_blocks}; pick a larger bucket."
            )
        flat.pad(capacity - flat.num_blocks, batch_size, cache.num_blocks)
        return _verify_blocks(flat, batch_size, cache)

    return HpuAttentionMetadata(
        is_prompt=False,
        slot_mapping=_verify_slots(seqs, batch_size, num_queries, cache),
        decode_by_window={window: layout(window) for window in windows},
        decode_by_chunk={
            chunk: layout(None, chunk) for chunk in cache.attention_chunks
        },
    )


def _verify_blocks(
    flat: _VerifyBlocks, batch_size: int, cache: CacheGeometry
) -> DecodeBlocks:
    def to_device(values: list[np.ndarray]) -> torch.Tensor:
        return torch.from_numpy(np.concatenate(values)).to(cache.device)

    groups = to_device(flat.block_groups)
    start, usage = to_device(flat.block_start), to_device(flat.block_usage)
    slots = torch.arange(cache.block_size, device=cache.device)
    hidden = (slots >= usage[..., None]) | (slots < start[..., None])  # [P, Q, B]
    # A block may hide every key from one of its queries (a later block of
    # the row, or one before a window): a finite floor keeps that query's
    # block maximum finite, and the row's visible keys outweigh it.
    bias = torch.zeros(hidden.shape, dtype=cache.dtype, device=cache.device)
    bias.masked_fill_(hidden, torch.finfo(cache.dtype).min)
    mapping = torch.zeros(
        groups.shape[0], batch_size + 1, dtype=cache.dtype, device=cache.device
    )
    mapping.scatter_(1, groups[:, None], 1.0)
    return DecodeBlocks(
        block_list=to_device(flat.block_list),
        block_groups=groups,
        block_mapping=mapping[:, :batch_size],
        block_bias=bias.unsqueeze(2),
        block_offsets=to_device(flat.block_offsets),
    )
