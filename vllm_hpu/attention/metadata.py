"""Attention metadata: the contract between our model runner and HpuAttentionImpl.

vLLM's Attention.forward calls unified_attention_with_output in Python (our platform
keeps opaque_attention_op() False; no vllm._C needed), which reads
forward_context.attn_metadata[layer_name]: the runner maps every layer to one object.
"""

from dataclasses import dataclass, field, replace

import numpy as np
import torch
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
        """[num_scheduled_tokens]: the last position each scheduled token sees,
        its own or the last of the bidirectional span holding it."""
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
    # Distinct windows of the sliding-window layers (each gets its own decode
    # blocks; prompt layers apply theirs to the pass's mask), and whether some
    # layer attends to every token.
    sliding_windows: tuple[int, ...] = ()
    full_attention: bool = True
    # Distinct chunk sizes of the chunked local attention layers (Llama 4), each
    # with its own decode blocks, as windows have.
    attention_chunks: tuple[int, ...] = ()
    # Under vLLM's hybrid KV cache manager, the geometry of each KV cache group
    # (its layers' windows), in the order of the requests' block tables; empty:
    # one group, this geometry.
    groups: tuple["CacheGeometry", ...] = ()
    # Every prompt mask carries its queries' span ends (a model whose image
    # tokens attend both ways), spans or not: one input structure per bucket
    # for a compiled graph.
    span_ends: bool = False
    # A hybrid model's state group (worker/kv_caches.py): a placeholder in
    # ``groups`` for which no attention metadata is built.
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
    # Prompt: who sees whom, per token (each layer makes its bias from it, tile
    # by tile: ops/prompt_mask.py).
    prompt_mask: PromptMask | None = None
    query_lens: torch.Tensor | None = None  # prompt [bs] long; padding rows -> 0
    # Decode: the flat blocks per sliding window (None: full attention) and
    # per attention chunk size.
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


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _padded(row: list[int], width: int, fill: int) -> list[int]:
    return row[:width] + [fill] * (width - len(row[:width]))


def _pad_batch(seqs: list[SeqLayout], batch_size: int) -> list[SeqLayout]:
    if len(seqs) > batch_size:
        raise ValueError(f"{len(seqs)} sequences do not fit batch size {batch_size}")
    return seqs + [_PADDING_ROW] * (batch_size - len(seqs))


def _prompt_slot_mapping(
    rows: list[SeqLayout], query_len: int, cache: CacheGeometry
) -> torch.Tensor:
    """Cache slot of every token of the padded [bs, q] batch, as [bs * q]."""
    block_size, dummy_block = cache.block_size, cache.num_blocks
    width = max(max(len(row.block_table) for row in rows), 1)
    tables = torch.tensor([_padded(r.block_table, width, dummy_block) for r in rows])
    start = torch.tensor([row.num_computed_tokens for row in rows])
    length = torch.tensor([row.num_scheduled_tokens for row in rows])
    offsets = torch.arange(query_len)
    positions = start[:, None] + offsets[None, :]
    block_ids = tables.gather(1, (positions // block_size).clamp(max=width - 1))
    slots = block_ids * block_size + positions % block_size
    # Padding tokens spread over the dummy block's slots.
    dummy = dummy_block * block_size + offsets % block_size
    slots = torch.where(offsets[None, :] < length[:, None], slots, dummy[None, :])
    return slots.flatten()


def _context_block_list(
    rows: list[SeqLayout], num_context_blocks: int, cache: CacheGeometry
) -> torch.Tensor:
    """[bs * C]: each row's context blocks, padded with the dummy block."""
    flat: list[int] = []
    for row in rows:
        needed = _cdiv(row.num_computed_tokens, cache.block_size)
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
    """Metadata of a prompt pass over ``batch_size * query_len`` tokens.

    Cost: O(batch_size * max blocks per request) Python list work and a handful
    of host tensor ops on [bs, q] and [bs, C*B + q]; no [q, K] mask is made here.
    """
    rows = _pad_batch(seqs, batch_size)
    block_list = None
    if num_context_blocks > 0:
        block_list = _context_block_list(rows, num_context_blocks, cache)
    slot_mapping = _prompt_slot_mapping(rows, query_len, cache)
    context_lens = torch.tensor([row.num_computed_tokens for row in rows])
    query_lens = torch.tensor([row.num_scheduled_tokens for row in rows])
    context_lens = context_lens.to(cache.device)
    query_lens = query_lens.to(cache.device)
    return HpuAttentionMetadata(
        is_prompt=True,
        slot_mapping=slot_mapping.to(cache.device),
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
    """[bs, q]: each query's last visible position (``SeqLayout.span_ends``;
    padding queries: their offset, unused); None when no row has a span,
    unless the cache asks for span ends in every pass."""
    if not cache.span_ends and not any(row.bidirectional_spans for row in rows):
        return None
    ends = np.tile(np.arange(query_len, dtype=np.int64), (len(rows), 1))
    for i, row in enumerate(rows):
        ends[i, : row.num_scheduled_tokens] = row.span_ends()
    return torch.from_numpy(ends).to(cache.device)


def first_visible_position(
    position: int, sliding_window: int | None, attention_chunk: int | None
) -> int:
    """The earliest key position a query at ``position`` attends: its chunk's
    start, the first of its last ``sliding_window`` positions, or 0."""
    if attention_chunk is not None:
        return position - position % attention_chunk
    if sliding_window is not None:
        return max(0, position + 1 - sliding_window)
    return 0


def decode_block_range(
    seq: SeqLayout,
    block_size: int,
    sliding_window: int | None,
    attention_chunk: int | None = None,
) -> tuple[int, int, int]:
    """(first block, end block, first visible position) of the keys that the
    decode token of ``seq`` attends (:func:`first_visible_position` on)."""
    position = seq.num_computed_tokens
    start = first_visible_position(position, sliding_window, attention_chunk)
    return start // block_size, _cdiv(position + 1, block_size), start


def window_capacity(
    num_blocks: int, batch_size: int, sliding_window: int | None, block_size: int
) -> int:
    """Padded block count of a layout: the bucket's P, or for a window (or a
    chunk of W positions) fewer, since W keys span at most cdiv(W - 1, B) + 1
    blocks per row (fixed per bucket, so graph shapes stay static). Buckets
    count every block of a row, as for full attention, so that warmup's
    sequences land on every bucket; a windowed layer's work is bounded by this
    capacity, not by P."""
    if sliding_window is None:
        return num_blocks
    per_row = _cdiv(sliding_window - 1, block_size) + 1
    return min(num_blocks, batch_size * per_row)


@dataclass
class _FlatBlocks:
    """Per flat block: physical id, row, visible token range, key offset; numpy
    arrays per row, so a batch of many blocks costs no Python loop per block."""

    block_list: list[np.ndarray] = field(default_factory=list)
    block_groups: list[np.ndarray] = field(default_factory=list)
    block_start: list[np.ndarray] = field(default_factory=list)  # first visible
    block_usage: list[np.ndarray] = field(default_factory=list)  # end of visible
    block_offsets: list[np.ndarray] = field(default_factory=list)

    @property
    def num_blocks(self) -> int:
        return sum(len(ids) for ids in self.block_list)

    def add_row(
        self,
        row: int,
        seq: SeqLayout,
        block_size: int,
        window: int | None,
        chunk: int | None = None,
    ) -> None:
        first, end, start = decode_block_range(seq, block_size, window, chunk)
        positions = np.arange(first, end, dtype=np.int64) * block_size
        self.block_list.append(np.asarray(seq.block_table[first:end], dtype=np.int64))
        self.block_groups.append(np.full(end - first, row, dtype=np.int64))
        self.block_start.append(np.maximum(start - positions, 0))
        end_slot = seq.num_computed_tokens + 1 - positions
        self.block_usage.append(np.minimum(end_slot, block_size))
        self.block_offsets.append(positions - seq.num_computed_tokens)

    def pad(self, count: int, batch_size: int, dummy_block: int) -> None:
        """Padding blocks read the dummy block for the sink row, one token each."""
        for values, fill in (
            (self.block_list, dummy_block),
            (self.block_groups, batch_size),
            (self.block_start, 0),
            (self.block_usage, 1),
            (self.block_offsets, 0),
        ):
            values.append(np.full(count, fill, dtype=np.int64))


def build_decode_metadata(
    seqs: list[SeqLayout], batch_size: int, num_blocks: int, cache: CacheGeometry
) -> HpuAttentionMetadata:
    """Metadata of a decode pass of ``batch_size`` tokens over ``num_blocks`` (P)
    flat blocks (spec section 2), one layout per sliding window and attention
    chunk size (and one for full attention): a windowed or chunked layer reads
    only the blocks it attends.

    Cost per layout: O(batch_size) Python work and O(P) numpy, a few
    host-to-device copies and small device ops ([P, block_size] bias, [P, bs]
    one-hot).
    """
    rows = _pad_batch(seqs, batch_size)
    block_size, dummy_block = cache.block_size, cache.num_blocks
    slots = [
        seq.block_table[seq.num_computed_tokens // block_size] * block_size
        + seq.num_computed_tokens % block_size
        for seq in seqs
    ]
    slots += [
        dummy_block * block_size + i % block_size for i in range(len(seqs), len(rows))
    ]
    windows: list[int | None] = [None] if cache.full_attention else []
    windows += cache.sliding_windows

    def layout(window: int | None, chunk: int | None = None) -> DecodeBlocks:
        flat = _FlatBlocks()
        for i, seq in enumerate(seqs):
            flat.add_row(i, seq, block_size, window, chunk)
        span = window if chunk is None else chunk
        capacity = window_capacity(num_blocks, batch_size, span, block_size)
        if flat.num_blocks > capacity:
            raise ValueError(
                f"decode batch needs {flat.num_blocks} blocks but "
                f"num_blocks={num_blocks}; pick a larger bucket."
            )
        flat.pad(capacity - flat.num_blocks, batch_size, dummy_block)
        return _decode_blocks(flat, batch_size, cache)

    return HpuAttentionMetadata(
        is_prompt=False,
        slot_mapping=torch.tensor(slots, dtype=torch.long).to(cache.device),
        decode_by_window={window: layout(window) for window in windows},
        decode_by_chunk={
            chunk: layout(None, chunk) for chunk in cache.attention_chunks
        },
    )


def block_mapping(
    groups: torch.Tensor, batch_size: int, cache: CacheGeometry
) -> torch.Tensor:
    """Each block's one-hot owning row, made in the model's dtype (an int64
    one-hot of P x bs would be 4 to 8 times larger); the sink row's column
    dropped."""
    mapping = torch.zeros(
        groups.shape[0], batch_size + 1, dtype=cache.dtype, device=cache.device
    )
    mapping.scatter_(1, groups[:, None], 1.0)
    return mapping[:, :batch_size]


def _decode_blocks(
    flat: _FlatBlocks, batch_size: int, cache: CacheGeometry
) -> DecodeBlocks:
    def to_device(values: list[np.ndarray]) -> torch.Tensor:
        return torch.from_numpy(np.concatenate(values)).to(cache.device)

    groups = to_device(flat.block_groups)
    start, usage = to_device(flat.block_start), to_device(flat.block_usage)
    offsets = torch.arange(cache.block_size, device=cache.device)[None, :]
    hidden = (offsets >= usage[:, None]) | (offsets < start[:, None])
    bias = torch.zeros(hidden.shape, dtype=cache.dtype, device=cache.device)
    return DecodeBlocks(
        block_list=to_device(flat.block_list),
        block_groups=groups,
        block_mapping=block_mapping(groups, batch_size, cache),
        block_bias=bias.masked_fill_(hidden, float("-inf")),
        block_offsets=to_device(flat.block_offsets),
    )
