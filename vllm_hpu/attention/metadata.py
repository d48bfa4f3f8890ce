"""Attention metadata: the contract between our model runner and HpuAttentionImpl.
vLLM's Attention.forward calls unified_attention_with_output in Python
(opaque_attention_op() False), which reads forward_context.attn_metadata[layer]."""

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from vllm.utils.math_utils import cdiv
from vllm.v1.attention.backend import AttentionMetadata

from vllm_hpu.ops.paged_attention import DecodeBlocks
from vllm_hpu.ops.prompt_mask import PromptMask, padded_rows_mask


@dataclass(frozen=True)
class SeqLayout:
    block_table: list[int]  # physical block ids, covering every token incl. new ones
    num_computed_tokens: int  # tokens already in the KV cache (the context)
    num_scheduled_tokens: int  # tokens computed in this forward pass (query length)
    # (first, last) positions of each span whose tokens see each other both ways
    # (Gemma 3's image tokens: vLLM's mm prefix ranges); causal elsewhere.
    bidirectional_spans: tuple[tuple[int, int], ...] = ()

    def span_ends(self) -> np.ndarray:
        """[num_scheduled_tokens]: the last position each token sees (span-aware)."""
        start = self.num_computed_tokens
        positions = np.arange(start, start + self.num_scheduled_tokens)
        ends = positions.copy()
        for first, last in self.bidirectional_spans:
            ends[(positions >= first) & (positions <= last)] = last
        return ends


@dataclass(frozen=True)
class CacheGeometry:
    block_size: int
    num_blocks: int  # real blocks; the dummy block's id is num_blocks
    dtype: torch.dtype  # model dtype (for masks / mappings)
    device: torch.device
    # Distinct sliding windows (each with its own decode blocks; prompt layers mask
    # the pass), and whether some layer attends to every token.
    sliding_windows: tuple[int, ...] = ()
    full_attention: bool = True
    # Chunk sizes of chunked local attention layers (Llama 4), each with its blocks.
    attention_chunks: tuple[int, ...] = ()
    # Per KV cache group under the hybrid manager, its layers' windows, in block
    # table order; empty: one group, this geometry.
    groups: tuple["CacheGeometry", ...] = ()
    # Every prompt mask carries span ends, spans or not: one input structure per
    # bucket for a compiled graph.
    span_ends: bool = False
    # A hybrid model's state group (worker/kv_caches.py): no attention metadata.
    holds_states: bool = False

    def group_geometries(self) -> tuple["CacheGeometry", ...]:
        return self.groups or (self,)

    def with_span_ends(self) -> "CacheGeometry":
        groups = tuple(group.with_span_ends() for group in self.groups)
        return replace(self, span_ends=True, groups=groups)


@dataclass
class HpuAttentionMetadata(AttentionMetadata):
    """Tensors only (besides the phase), so a bucket's shapes fix the graph."""

    is_prompt: bool
    slot_mapping: torch.Tensor  # [num_tokens] long; padding -> the dummy block
    # Prompt: [bs * C] context blocks, row-major (None when C == 0).
    block_list: torch.Tensor | None = None
    # Prompt: who sees whom, per token (layers make their bias per tile: prompt_mask).
    prompt_mask: PromptMask | None = None
    query_lens: torch.Tensor | None = None  # prompt [bs] long; padding rows -> 0
    # Decode: the flat blocks per sliding window (None: full) and per chunk size.
    decode_by_window: dict[int | None, DecodeBlocks] = field(default_factory=dict)
    decode_by_chunk: dict[int, DecodeBlocks] = field(default_factory=dict)

    def decode_blocks(
        self, sliding_window: int | None = None, attention_chunk: int | None = None
    ) -> DecodeBlocks:
        if attention_chunk is not None:
            return self.decode_by_chunk[attention_chunk]
        return self.decode_by_window[sliding_window]

    # Read by vLLM's MLAAttention.forward_impl to split a pass into prompt
    # tokens (MHA) and decode tokens (MQA): each of our passes is one or the other.
    @property
    def num_actual_tokens(self) -> int:
        return self.slot_mapping.shape[0]

    @property
    def num_decode_tokens(self) -> int:
        return 0 if self.is_prompt else self.num_actual_tokens

    @property
    def num_decodes(self) -> int:
        return self.num_decode_tokens

    @property
    def num_prefills(self) -> int:
        return self.prompt_mask.batch_size if self.prompt_mask is not None else 0

    @property
    def decode(self) -> DecodeBlocks | None:
        return None if self.is_prompt else self.decode_blocks()

    # Read by vLLM's sparse MLA (MLAAttention._use_sparse_mha): a prompt pass
    # runs as MHA under its layer's top-k mask (attention/sparse_mla.py).
    @property
    def prefill(self) -> "HpuAttentionMetadata | None":
        return self if self.is_prompt else None

    @property
    def use_dense_mha(self) -> bool:
        return True


_PADDING_ROW = SeqLayout(block_table=[], num_computed_tokens=0, num_scheduled_tokens=0)


def _padded(row: list[int], width: int, fill: int) -> list[int]:
    return row[:width] + [fill] * (width - len(row[:width]))


def _pad_batch(seqs: list[SeqLayout], batch_size: int) -> list[SeqLayout]:
    if len(seqs) > batch_size:
        raise ValueError(f"{len(seqs)} sequences do not fit batch size {batch_size}")
    return seqs + [_PADDING_ROW] * (batch_size - len(seqs))


@dataclass(frozen=True)
class PassRows:
    """A pass's rows as arrays, one entry per row."""

    context: np.ndarray  # num_computed_tokens
    query_lens: np.ndarray  # tokens of the row in the pass
    starts: np.ndarray  # flat index of the row's first token
    tables: np.ndarray  # every row's block table, one after another
    table_starts: np.ndarray  # where the row's table starts in ``tables``

    @classmethod
    def of(cls, seqs: list[SeqLayout], starts: list[int]) -> "PassRows":
        lengths = np.array([len(s.block_table) for s in seqs], dtype=np.int64)
        return cls(
            context=np.array([s.num_computed_tokens for s in seqs], dtype=np.int64),
            query_lens=np.array([s.num_scheduled_tokens for s in seqs], dtype=np.int64),
            starts=np.array(starts, dtype=np.int64),
            tables=np.fromiter(
                itertools.chain.from_iterable(s.block_table for s in seqs),
                dtype=np.int64,
                count=int(lengths.sum()),
            ),
            table_starts=np.cumsum(lengths) - lengths,
        )

    def block_ids(self, rows: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """Physical id of block ``blocks[k]`` of row ``rows[k]``."""
        return self.tables[self.table_starts[rows] + blocks]

    def slot_mapping(self, num_tokens: int, cache: CacheGeometry) -> torch.Tensor:
        """[num_tokens] cache slot per token; padding spreads over the dummy block."""
        block_size = cache.block_size
        slots = cache.num_blocks * block_size + np.arange(num_tokens) % block_size
        counts = self.query_lens
        row = np.repeat(np.arange(len(counts)), counts)
        offset = np.arange(len(row)) - np.repeat(np.cumsum(counts) - counts, counts)
        positions = self.context[row] + offset
        slots[self.starts[row] + offset] = (
            self.block_ids(row, positions // block_size) * block_size
            + positions % block_size
        )
        return torch.from_numpy(slots).to(cache.device)


def _context_block_list(
    rows: list[SeqLayout], num_context_blocks: int, cache: CacheGeometry
) -> torch.Tensor:
    """[bs * C]: each row's context blocks, padded with the dummy block."""
    flat: list[int] = []
    for row in rows:
        needed = cdiv(row.num_computed_tokens, cache.block_size)
        if needed > num_context_blocks:
            raise ValueError(
                f"num_context_blocks={num_context_blocks} is below the {needed} "
                "blocks of cached context of a request; pick a larger bucket."
            )
        flat += _padded(row.block_table[:needed], num_context_blocks, cache.num_blocks)
    return torch.tensor(flat, dtype=torch.long).to(cache.device)


def build_prompt_metadata(
    seqs: list[SeqLayout],
    batch_size: int,
    query_len: int,
    num_context_blocks: int,
    cache: CacheGeometry,
) -> HpuAttentionMetadata:
    """A prompt pass of ``batch_size * query_len`` tokens (no [q, K] mask here)."""
    rows = _pad_batch(seqs, batch_size)
    block_list = None
    if num_context_blocks > 0:
        block_list = _context_block_list(rows, num_context_blocks, cache)
    starts = [i * query_len for i in range(len(seqs))]
    slot_mapping = PassRows.of(seqs, starts).slot_mapping(batch_size * query_len, cache)
    context_lens = torch.tensor([row.num_computed_tokens for row in rows])
    query_lens = torch.tensor([row.num_scheduled_tokens for row in rows])
    context_lens = context_lens.to(cache.device)
    query_lens = query_lens.to(cache.device)
    return HpuAttentionMetadata(
        is_prompt=True,
        slot_mapping=slot_mapping,
        block_list=block_list,
        prompt_mask=padded_rows_mask(
            context_lens,
            query_lens,
            query_len,
            num_context_blocks * cache.block_size,
            query_span_end=_query_span_end(rows, query_len, cache),
        ),
        query_lens=query_lens,
    )


def _query_span_end(
    rows: list[SeqLayout], query_len: int, cache: CacheGeometry
) -> torch.Tensor | None:
    """[bs, q]: each query's last visible position (``SeqLayout.span_ends``); None
    when no row has a span, unless the cache asks for span ends in every pass."""
    if not cache.span_ends and not any(row.bidirectional_spans for row in rows):
        return None
    ends = np.tile(np.arange(query_len, dtype=np.int64), (len(rows), 1))
    for i, row in enumerate(rows):
        ends[i, : row.num_scheduled_tokens] = row.span_ends()
    return torch.from_numpy(ends).to(cache.device)


def first_visible_position(
    position: Any, sliding_window: int | None, attention_chunk: int | None
) -> Any:
    """The earliest key position a query at ``position`` (int or array) attends."""
    if attention_chunk is not None:
        return position - position % attention_chunk
    if sliding_window is not None:
        return np.maximum(0, position + 1 - sliding_window)
    return position * 0


def window_capacity(
    num_blocks: int, batch_size: int, sliding_window: int | None, block_size: int
) -> int:
    """Padded block count: the bucket's P, or for a window (or chunk) of W positions
    at most cdiv(W - 1, B) + 1 blocks per row, fixed per bucket (static shapes)."""
    if sliding_window is None:
        return num_blocks
    per_row = cdiv(sliding_window - 1, block_size) + 1
    return min(num_blocks, batch_size * per_row)


def _owned_slots(rows: PassRows, batch_size: int, num_queries: int) -> np.ndarray:
    """Slots each row owns (to the next row's first, or group end); refuses misfits."""
    num_groups = int(rows.starts.max(initial=-1)) // num_queries + 1
    if num_groups > batch_size:
        raise ValueError(
            f"{num_groups} query groups do not fit batch size {batch_size}"
        )
    order = np.argsort(rows.starts, kind="stable")
    ordered = rows.starts[order]
    following = np.append(ordered[1:], np.iinfo(np.int64).max)
    group_ends = (ordered // num_queries + 1) * num_queries
    owned = np.empty_like(ordered)
    owned[order] = np.minimum(following, group_ends) - ordered
    if (rows.query_lens > owned).any():
        i = int(np.argmax(rows.query_lens > owned))
        raise ValueError(
            f"{rows.query_lens[i]} tokens do not fit the {owned[i]} slots their "
            f"packing leaves ({num_queries} queries per group)"
        )
    return owned


def _flat_layout(
    rows: PassRows,
    owned: np.ndarray,
    num_queries: int,
    window: int | None,
    chunk: int | None,
    block_size: int,
) -> dict[str, np.ndarray]:
    """Per flat block: physical id, query group, key offset (ALiBi), and per slot the
    visible keys [start, usage) (empty for other rows'); slot ``j`` queries at the
    row's ``j``-th token (past its tokens: the last)."""
    slot0 = rows.starts % num_queries
    slot = np.arange(num_queries)[None, :] - slot0[:, None]  # [R, Q]: the row's j
    is_owned = (slot >= 0) & (slot < owned[:, None])
    last = np.maximum(rows.query_lens - 1, 0)[:, None]
    positions = rows.context[:, None] + np.clip(slot, 0, last)
    visible = first_visible_position(positions, window, chunk)
    first = first_visible_position(rows.context, window, chunk) // block_size
    final = rows.context + np.minimum(owned, rows.query_lens) - 1
    counts = (final + block_size) // block_size - first
    row = np.repeat(np.arange(len(counts)), counts)
    block = (
        first[row] + np.arange(len(row)) - np.repeat(np.cumsum(counts) - counts, counts)
    )
    keys = (block * block_size)[:, None]
    start = np.maximum(visible[row] - keys, 0)
    usage = np.clip(positions[row] + 1 - keys, 0, block_size)
    return {
        "block_list": rows.block_ids(row, block),
        "block_groups": rows.starts[row] // num_queries,
        "block_offsets": keys[:, 0] - rows.context[row] + slot0[row],
        "block_start": np.where(is_owned[row], start, 0),
        "block_usage": np.where(is_owned[row], usage, 0),
    }


def _padded_layout(
    layout: dict[str, np.ndarray], count: int, batch_size: int, dummy_block: int
) -> dict[str, np.ndarray]:
    """Padding blocks read the dummy block for the sink row, one token each."""
    fills = {
        "block_list": dummy_block,
        "block_groups": batch_size,
        "block_offsets": 0,
        "block_start": 0,
        "block_usage": 1,
    }
    return {
        name: np.concatenate(
            (values, np.full((count, *values.shape[1:]), fills[name], np.int64))
        )
        for name, values in layout.items()
    }


def _decode_blocks(
    layout: dict[str, np.ndarray], batch_size: int, cache: CacheGeometry
) -> DecodeBlocks:
    on_device = {n: torch.from_numpy(v).to(cache.device) for n, v in layout.items()}
    start, usage = on_device["block_start"], on_device["block_usage"]
    keys = torch.arange(cache.block_size, device=cache.device)
    hidden = (keys >= usage[..., None]) | (keys < start[..., None])  # [P, Q, B]
    # A block may hide every key from a query (a verified row's later block, one
    # before a window): a finite floor keeps its maximum finite.
    bias = torch.zeros(hidden.shape, dtype=cache.dtype, device=cache.device)
    bias.masked_fill_(hidden, torch.finfo(cache.dtype).min)
    groups = on_device["block_groups"]
    return DecodeBlocks(
        block_list=on_device["block_list"],
        block_groups=groups,
        block_mapping=block_mapping(groups, batch_size, cache),
        # One query per row (decode): [P, B], else [P, Q, 1, B].
        block_bias=bias.squeeze(1) if bias.shape[1] == 1 else bias.unsqueeze(2),
        block_offsets=on_device["block_offsets"],
    )


def build_decode_metadata(
    seqs: list[SeqLayout],
    batch_size: int,
    num_blocks: int,
    cache: CacheGeometry,
    starts: list[int] | None = None,
    num_queries: int = 1,
) -> HpuAttentionMetadata:
    """A decode pass of ``batch_size`` groups of Q slots over P flat blocks: a token
    per row, or when verifying row ``i``'s tokens from ``starts[i]``, causal. One
    layout per window and chunk size (and full): a layer reads only its blocks."""
    rows = PassRows.of(seqs, list(range(len(seqs))) if starts is None else starts)
    owned = _owned_slots(rows, batch_size, num_queries)
    windows: list[int | None] = [None] if cache.full_attention else []
    windows += cache.sliding_windows

    def layout(window: int | None, chunk: int | None = None) -> DecodeBlocks:
        flat = _flat_layout(rows, owned, num_queries, window, chunk, cache.block_size)
        used = len(flat["block_list"])
        # A group's rows need <= Q times a window's blocks (q queries: window + q - 1).
        span = window if chunk is None else chunk
        capacity = window_capacity(
            num_blocks, batch_size * num_queries, span, cache.block_size
        )
        if used > capacity:
            raise ValueError(
                f"decode batch needs {used} blocks but num_blocks={num_blocks}; "
                "pick a larger bucket."
            )
        flat = _padded_layout(flat, capacity - used, batch_size, cache.num_blocks)
        return _decode_blocks(flat, batch_size, cache)

    return HpuAttentionMetadata(
        is_prompt=False,
        slot_mapping=rows.slot_mapping(batch_size * num_queries, cache),
        decode_by_window={window: layout(window) for window in windows},
        decode_by_chunk={
            chunk: layout(None, chunk) for chunk in cache.attention_chunks
        },
    )


def block_mapping(
    groups: torch.Tensor, batch_size: int, cache: CacheGeometry
) -> torch.Tensor:
    """Each block's one-hot owning row in the model's dtype (an int64 one-hot would
    be 4 to 8 times larger); the sink row's column dropped."""
    mapping = torch.zeros(
        groups.shape[0], batch_size + 1, dtype=cache.dtype, device=cache.device
    )
    mapping.scatter_(1, groups[:, None], 1.0)
    return mapping[:, :batch_size]
