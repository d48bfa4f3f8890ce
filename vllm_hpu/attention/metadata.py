"""Attention metadata: the contract between our model runner and HpuAttentionImpl.

vLLM's Attention.forward calls unified_attention_with_output in Python (our platform
keeps opaque_attention_op() False; no vllm._C needed), which reads
forward_context.attn_metadata[layer_name]: the runner maps every layer to one object.
"""

from dataclasses import dataclass, field

import torch
from vllm.v1.attention.backend import AttentionMetadata

from vllm_hpu.ops.paged_attention import DecodeBlocks


@dataclass(frozen=True)
class SeqLayout:
    block_table: list[int]  # physical block ids, covering every token incl. new ones
    num_computed_tokens: int  # tokens already in the KV cache (the context)
    num_scheduled_tokens: int  # tokens computed in this forward pass (query length)


@dataclass(frozen=True)
class CacheGeometry:
    block_size: int
    num_blocks: int  # real blocks; the dummy block's id is num_blocks
    dtype: torch.dtype  # model dtype (for masks / mappings)
    device: torch.device
    # Distinct windows of the sliding-window layers (each gets its own decode
    # blocks and prompt mask), and whether some layer attends to every token.
    sliding_windows: tuple[int, ...] = ()
    full_attention: bool = True
    # Distinct chunk sizes of the chunked local attention layers (Llama 4), each
    # with its own decode blocks and prompt mask, as windows have.
    attention_chunks: tuple[int, ...] = ()


@dataclass
class HpuAttentionMetadata(AttentionMetadata):
    """Tensors only (besides the phase), so a bucket's shapes fix the graph."""

    is_prompt: bool
    slot_mapping: torch.Tensor  # [num_tokens] long; padding -> the dummy block
    # Prompt: [bs * C] context blocks, row-major (None when C == 0).
    block_list: torch.Tensor | None = None
    attn_bias: torch.Tensor | None = None  # prompt [bs, 1, q, C * block_size + q]
    key_positions: torch.Tensor | None = None  # prompt [bs, C * block_size + q]
    window_bias: dict[int, torch.Tensor] = field(default_factory=dict)  # prompt
    chunk_bias: dict[int, torch.Tensor] = field(default_factory=dict)  # prompt
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

    def prompt_bias(
        self, sliding_window: int | None = None, attention_chunk: int | None = None
    ) -> torch.Tensor:
        """[bs, 1, q, K]: the mask of a layer with this window or chunk size
        (None: full attention)."""
        if attention_chunk is not None:
            return self.chunk_bias[attention_chunk]
        if sliding_window is None:
            assert self.attn_bias is not None
            return self.attn_bias
        return self.window_bias[sliding_window]

    def query_key_distance(self) -> torch.Tensor:
        """[bs, q, K]: key position minus query position (prompt; for ALiBi)."""
        assert self.key_positions is not None and self.attn_bias is not None
        query_positions = self.key_positions[:, -self.attn_bias.shape[2] :]
        return self.key_positions[:, None, :] - query_positions[:, :, None]

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
        return self.attn_bias.shape[0] if self.attn_bias is not None else 0

    @property
    def decode(self) -> DecodeBlocks | None:
        return None if self.is_prompt else self.decode_blocks()


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


def _prompt_key_positions(
    rows: list[SeqLayout], query_len: int, num_context_blocks: int, cache: CacheGeometry
) -> torch.Tensor:
    """[bs, C*B + q]: position of every key; context blocks start at position 0
    and the current tokens follow each row's own context."""
    past = torch.arange(num_context_blocks * cache.block_size)
    context = torch.tensor([row.num_computed_tokens for row in rows])
    current = context[:, None] + torch.arange(query_len)[None, :]
    keys = torch.cat((past.expand(len(rows), -1), current), dim=1)
    return keys.to(cache.device)


def _prompt_allowed(
    rows: list[SeqLayout],
    query_len: int,
    num_context_blocks: int,
    cache: CacheGeometry,
) -> torch.Tensor:
    """[bs, q, C*B + q] bool: key k is visible to query t when it is a cached
    context token (k < ctx) or a current token c <= t of the request; the
    diagonal is always visible so padded rows stay finite."""
    past_len = num_context_blocks * cache.block_size
    context = torch.tensor([row.num_computed_tokens for row in rows])
    length = torch.tensor([row.num_scheduled_tokens for row in rows])
    context, length = context.to(cache.device), length.to(cache.device)
    keys = torch.arange(past_len + query_len, device=cache.device)
    queries = torch.arange(query_len, device=cache.device)[:, None]
    past_ok = (keys < past_len) & (keys[None, :] < context[:, None])  # [bs, K]
    current = keys - past_len
    causal = (current >= 0) & (current <= queries)  # [q, K]
    real = (current[None, :] < length[:, None])[:, None, :] | (current == queries)
    return past_ok[:, None, :] | (causal[None] & real)


def _as_bias(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[bs, q, K] bool -> [bs, 1, q, K] additive mask (0 or -inf)."""
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return bias.masked_fill_(~allowed, float("-inf")).unsqueeze(1)


def _window_biases(
    allowed: torch.Tensor, key_positions: torch.Tensor, cache: CacheGeometry
) -> dict[int, torch.Tensor]:
    """Per window W, the mask that also hides keys W or more positions before
    the query (the diagonal, distance 0, stays visible)."""
    query_len = allowed.shape[1]
    distance = key_positions[:, -query_len:, None] - key_positions[:, None, :]
    return {
        window: _as_bias(allowed & (distance < window), cache.dtype)
        for window in cache.sliding_windows
    }


def _chunk_biases(
    allowed: torch.Tensor, key_positions: torch.Tensor, cache: CacheGeometry
) -> dict[int, torch.Tensor]:
    """Per chunk size C, the mask that also hides keys of an earlier chunk than
    the query's (chunks of positions [0, C), [C, 2C), ...)."""
    query_len = allowed.shape[1]
    query_chunk = key_positions[:, -query_len:, None]
    key_chunk = key_positions[:, None, :]
    return {
        size: _as_bias(
            allowed & (query_chunk // size == key_chunk // size), cache.dtype
        )
        for size in cache.attention_chunks
    }


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

    Cost: O(batch_size * max blocks per request) Python list work, a handful of
    host tensor ops on [bs, q], and a [bs, q, C*B + q] mask made on the device
    (one more per sliding window).
    """
    rows = _pad_batch(seqs, batch_size)
    block_list = None
    if num_context_blocks > 0:
        block_list = _context_block_list(rows, num_context_blocks, cache)
    slot_mapping = _prompt_slot_mapping(rows, query_len, cache)
    allowed = _prompt_allowed(rows, query_len, num_context_blocks, cache)
    key_positions = _prompt_key_positions(rows, query_len, num_context_blocks, cache)
    return HpuAttentionMetadata(
        is_prompt=True,
        slot_mapping=slot_mapping.to(cache.device),
        block_list=block_list,
        attn_bias=_as_bias(allowed, cache.dtype),
        key_positions=key_positions,
        window_bias=_window_biases(allowed, key_positions, cache),
        chunk_bias=_chunk_biases(allowed, key_positions, cache),
        query_lens=torch.tensor([row.num_scheduled_tokens for row in rows]).to(
            cache.device
        ),
    )


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


def _window_capacity(
    num_blocks: int, batch_size: int, sliding_window: int | None, block_size: int
) -> int:
    """Padded block count of a layout: the bucket's P, or for a window (or a
    chunk) fewer, since W keys span at most cdiv(W - 1, B) + 1 blocks per row
    (fixed per bucket, so graph shapes stay static). Buckets count every block
    of a row, as for full attention, so that warmup's sequences land on every
    bucket; a windowed layer's work is bounded by this capacity, not by P."""
    if sliding_window is None:
        return num_blocks
    per_row = _cdiv(sliding_window - 1, block_size) + 1
    return min(num_blocks, batch_size * per_row)


@dataclass
class _FlatBlocks:
    """Per flat block: physical id, row, visible token range, key offset."""

    block_list: list[int] = field(default_factory=list)
    block_groups: list[int] = field(default_factory=list)
    block_start: list[int] = field(default_factory=list)  # first visible slot
    block_usage: list[int] = field(default_factory=list)  # end of visible slots
    block_offsets: list[int] = field(default_factory=list)

    def add_row(
        self,
        row: int,
        seq: SeqLayout,
        block_size: int,
        window: int | None,
        chunk: int | None = None,
    ) -> None:
        first, end, start = decode_block_range(seq, block_size, window, chunk)
        query_position = seq.num_computed_tokens
        for j in range(first, end):
            block_position = j * block_size
            self.block_list.append(seq.block_table[j])
            self.block_groups.append(row)
            self.block_start.append(max(start - block_position, 0))
            end_slot = seq.num_computed_tokens + 1 - block_position
            self.block_usage.append(min(end_slot, block_size))
            self.block_offsets.append(block_position - query_position)

    def pad(self, count: int, batch_size: int, dummy_block: int) -> None:
        """Padding blocks read the dummy block for the sink row, one token each."""
        self.block_list += [dummy_block] * count
        self.block_groups += [batch_size] * count
        self.block_start += [0] * count
        self.block_usage += [1] * count
        self.block_offsets += [0] * count


def build_decode_metadata(
    seqs: list[SeqLayout], batch_size: int, num_blocks: int, cache: CacheGeometry
) -> HpuAttentionMetadata:
    """Metadata of a decode pass of ``batch_size`` tokens over ``num_blocks`` (P)
    flat blocks (spec section 2), one layout per sliding window and attention
    chunk size (and one for full attention): a windowed or chunked layer reads
    only the blocks it attends.

    Cost per layout: O(P + batch_size) Python list work, a few host-to-device
    copies and small device ops ([P, block_size] bias, [P, bs] one-hot).
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
    layout = _FlatLayout(seqs, batch_size, num_blocks, cache)
    return HpuAttentionMetadata(
        is_prompt=False,
        slot_mapping=torch.tensor(slots, dtype=torch.long).to(cache.device),
        decode_by_window={window: layout.blocks(window) for window in windows},
        decode_by_chunk={
            chunk: layout.blocks(None, chunk) for chunk in cache.attention_chunks
        },
    )


@dataclass(frozen=True)
class _FlatLayout:
    """A decode batch, laid out once per window or chunk size."""

    seqs: list[SeqLayout]
    batch_size: int
    num_blocks: int
    cache: CacheGeometry

    def blocks(self, window: int | None, chunk: int | None = None) -> DecodeBlocks:
        """The flat blocks of a layer attending its last ``window`` positions, its
        ``chunk``, or (both None) every position."""
        block_size = self.cache.block_size
        flat = _FlatBlocks()
        for i, seq in enumerate(self.seqs):
            flat.add_row(i, seq, block_size, window, chunk)
        span = window if chunk is None else chunk
        capacity = _window_capacity(self.num_blocks, self.batch_size, span, block_size)
        if len(flat.block_list) > capacity:
            raise ValueError(
                f"decode batch needs {len(flat.block_list)} blocks but "
                f"num_blocks={self.num_blocks}; pick a larger bucket."
            )
        flat.pad(
            capacity - len(flat.block_list), self.batch_size, self.cache.num_blocks
        )
        return _decode_blocks(flat, self.batch_size, self.cache)


def _decode_blocks(
    flat: _FlatBlocks, batch_size: int, cache: CacheGeometry
) -> DecodeBlocks:
    def to_device(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long).to(cache.device)

    groups = to_device(flat.block_groups)
    start, usage = to_device(flat.block_start), to_device(flat.block_usage)
    offsets = torch.arange(cache.block_size, device=cache.device)[None, :]
    hidden = (offsets >= usage[:, None]) | (offsets < start[:, None])
    bias = torch.zeros(hidden.shape, dtype=cache.dtype, device=cache.device)
    mapping = torch.nn.functional.one_hot(groups, batch_size + 1)[:, :batch_size]
    return DecodeBlocks(
        block_list=to_device(flat.block_list),
        block_groups=groups,
        block_mapping=mapping.to(cache.dtype),
        block_bias=bias.masked_fill_(hidden, float("-inf")),
        block_offsets=to_device(flat.block_offsets),
    )
