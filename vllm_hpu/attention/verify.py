"""Metadata of a verification pass: each row's ``q <= Q`` tokens (its last
sampled token and its drafts) against its cached blocks in the flat decode
layout, causal among the row's own tokens.

The pass is a decode pass of ``bs`` query groups of ``Q`` slots each, slot
``j`` of group ``g`` at flat index ``g * Q + j``. A row's tokens take
consecutive slots of one group; rows with fewer than ``Q`` tokens (few or no
drafts) share groups (:func:`pack_rows`), so a batch where some rows drafted
nothing pads few tokens. A group's blocks are its rows' blocks, each biased
per slot: a slot sees only its own row's keys. Keys and values are written
first (``slot_mapping``, as decode does), so each query reads its own row's
new tokens from the cache: query ``j`` of a row with context ``c`` sees key
positions up to ``c + j`` (within its window or chunk). A group's free slots
repeat its last row's last query; padding groups and blocks are decode's.
"""

from dataclasses import dataclass, field

import numpy as np
import torch
from vllm.utils.math_utils import cdiv

from vllm_hpu.attention.metadata import (
    CacheGeometry,
    HpuAttentionMetadata,
    SeqLayout,
    block_mapping,
    first_visible_position,
    window_capacity,
)
from vllm_hpu.ops.paged_attention import DecodeBlocks


def pack_rows(query_lens: list[int], num_queries: int) -> list[int]:
    """The flat index of each row's first token: rows in order, each in the
    first group with room for all its tokens (first fit), else a new group."""
    free: list[int] = []  # free slots per group
    starts = []
    for count in query_lens:
        if count > num_queries:
            raise ValueError(f"{count} tokens do not fit {num_queries} queries per row")
        group = next((g for g, room in enumerate(free) if room >= count), len(free))
        if group == len(free):
            free.append(num_queries)
        starts.append(group * num_queries + num_queries - free[group])
        free[group] -= count
    return starts


def num_groups(starts: list[int], num_queries: int) -> int:
    """The query groups a packing from :func:`pack_rows` fills."""
    return max(starts, default=-1) // num_queries + 1


def _owned_slots(starts: list[int], num_queries: int) -> list[int]:
    """Slots each row owns: up to the next row's first in its group, or to the
    group's end for its group's last row."""
    ordered = sorted(starts)
    owned = {}
    for start, following in zip(ordered, [*ordered[1:], 2**62], strict=True):
        group_end = (start // num_queries + 1) * num_queries
        owned[start] = min(following, group_end) - start
    return [owned[start] for start in starts]


def query_positions(seq: SeqLayout, num_slots: int) -> np.ndarray:
    """[num_slots] the position each of the row's slots queries at (past its
    tokens: the last)."""
    last = seq.num_scheduled_tokens - 1
    return seq.num_computed_tokens + np.minimum(np.arange(num_slots), last)


def _first_visible(
    positions: np.ndarray, window: int | None, chunk: int | None
) -> np.ndarray:
    return np.array([first_visible_position(int(p), window, chunk) for p in positions])


@dataclass
class _VerifyBlocks:
    """Per flat block: physical id, group, key offset; per block and slot the
    visible slot range [start, usage) (empty for other rows' slots)."""

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
        self,
        seq: SeqLayout,
        start: int,
        num_slots: int,
        window: int | None,
        chunk: int | None,
    ) -> None:
        """The row's blocks, from its first query's first visible key to its
        last query's own, for its ``num_slots`` slots from flat index
        ``start``: each of them sees up to its own position."""
        positions = query_positions(seq, num_slots)
        starts = _first_visible(positions, window, chunk)
        first = int(starts.min()) // self.block_size
        end = cdiv(int(positions.max()) + 1, self.block_size)
        keys = np.arange(first, end, dtype=np.int64)[:, None] * self.block_size
        group, slot = divmod(start, self.num_queries)
        slots = slice(slot, slot + num_slots)
        block_start = np.zeros((end - first, self.num_queries), dtype=np.int64)
        block_usage = np.zeros_like(block_start)  # other rows' slots see nothing
        block_start[:, slots] = np.maximum(starts[None, :] - keys, 0)
        block_usage[:, slots] = np.clip(
            positions[None, :] + 1 - keys, 0, self.block_size
        )
        self.block_list.append(np.asarray(seq.block_table[first:end], dtype=np.int64))
        self.block_groups.append(np.full(end - first, group, dtype=np.int64))
        # ALiBi: key position minus query position is offset + key slot - slot.
        self.block_offsets.append(keys[:, 0] - seq.num_computed_tokens + slot)
        self.block_start.append(block_start)
        self.block_usage.append(block_usage)

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
    seqs: list[SeqLayout], starts: list[int], num_tokens: int, cache: CacheGeometry
) -> torch.Tensor:
    """[num_tokens] cache slot of every token; padding spreads over the dummy
    block."""
    block_size = cache.block_size
    slots = cache.num_blocks * block_size + np.arange(num_tokens) % block_size
    for seq, start in zip(seqs, starts, strict=True):
        table = np.asarray(seq.block_table, dtype=np.int64)
        positions = seq.num_computed_tokens + np.arange(seq.num_scheduled_tokens)
        slots[start : start + len(positions)] = (
            table[positions // block_size] * block_size + positions % block_size
        )
    return torch.from_numpy(slots).to(cache.device)


def build_verify_metadata(
    seqs: list[SeqLayout],
    starts: list[int],
    batch_size: int,
    num_queries: int,
    num_blocks: int,
    cache: CacheGeometry,
) -> HpuAttentionMetadata:
    """Metadata of a verification pass of ``batch_size`` groups of
    ``num_queries`` (Q) slots over ``num_blocks`` (P) flat blocks, row ``i``'s
    tokens from flat index ``starts[i]`` (:func:`pack_rows`), one layout per
    sliding window and attention chunk size, as decode's."""
    if num_groups(starts, num_queries) > batch_size:
        raise ValueError(
            f"{num_groups(starts, num_queries)} query groups do not fit "
            f"batch size {batch_size}"
        )
    owned = _owned_slots(starts, num_queries)
    for seq, num_slots in zip(seqs, owned, strict=True):
        if seq.num_scheduled_tokens > num_slots:
            raise ValueError(
                f"{seq.num_scheduled_tokens} tokens do not fit the {num_slots} "
                f"slots their packing leaves ({num_queries} queries per group)"
            )
    windows: list[int | None] = [None] if cache.full_attention else []
    windows += cache.sliding_windows

    def layout(window: int | None, chunk: int | None = None) -> DecodeBlocks:
        flat = _VerifyBlocks(cache.block_size, num_queries)
        for seq, start, num_slots in zip(seqs, starts, owned, strict=True):
            flat.add_row(seq, start, num_slots, window, chunk)
        # A group's rows need at most Q times a window's blocks in all (a row
        # of q queries: its window widened by q - 1 keys).
        span = window if chunk is None else chunk
        capacity = window_capacity(
            num_blocks, batch_size * num_queries, span, cache.block_size
        )
        if flat.num_blocks > capacity:
            raise ValueError(
                f"verification batch needs {flat.num_blocks} blocks but "
                f"num_blocks={num_blocks}; pick a larger bucket."
            )
        flat.pad(capacity - flat.num_blocks, batch_size, cache.num_blocks)
        return _verify_blocks(flat, batch_size, cache)

    return HpuAttentionMetadata(
        is_prompt=False,
        slot_mapping=_verify_slots(seqs, starts, batch_size * num_queries, cache),
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
    return DecodeBlocks(
        block_list=to_device(flat.block_list),
        block_groups=groups,
        block_mapping=block_mapping(groups, batch_size, cache),
        block_bias=bias.unsqueeze(2),
        block_offsets=to_device(flat.block_offsets),
    )
