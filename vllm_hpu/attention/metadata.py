"""Attention metadata: the contract between our model runner and HpuAttentionImpl.

vLLM's Attention.forward calls unified_attention_with_output in Python (our platform
keeps opaque_attention_op() False; no vllm._C needed), which reads
forward_context.attn_metadata[layer_name]: the runner maps every layer to one object.
"""

from dataclasses import dataclass

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


@dataclass
class HpuAttentionMetadata(AttentionMetadata):
    """Tensors only (besides the phase), so a bucket's shapes fix the graph."""

    is_prompt: bool
    slot_mapping: torch.Tensor  # [num_tokens] long; padding -> the dummy block
    # Prompt: [bs * C] context blocks, row-major (None when C == 0).
    # Decode: [P] blocks of all rows (see DecodeBlocks).
    block_list: torch.Tensor | None = None
    block_groups: torch.Tensor | None = None  # decode [P] long; padding -> bs
    block_mapping: torch.Tensor | None = None  # decode [P, bs]
    block_bias: torch.Tensor | None = None  # decode [P, block_size]
    attn_bias: torch.Tensor | None = None  # prompt [bs, 1, q, C * block_size + q]
    query_lens: torch.Tensor | None = None  # prompt [bs] long; padding rows -> 0

    def decode_blocks(self) -> DecodeBlocks:
        assert self.block_list is not None and self.block_groups is not None
        assert self.block_mapping is not None and self.block_bias is not None
        return DecodeBlocks(
            self.block_list, self.block_groups, self.block_mapping, self.block_bias
        )


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


def _prompt_attn_bias(
    rows: list[SeqLayout],
    query_len: int,
    num_context_blocks: int,
    cache: CacheGeometry,
) -> torch.Tensor:
    """[bs, 1, q, C*B + q]: key k is visible to query t when it is a cached
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
    allowed = past_ok[:, None, :] | (causal[None] & real)
    bias = torch.zeros(allowed.shape, dtype=cache.dtype, device=cache.device)
    return bias.masked_fill_(~allowed, float("-inf")).unsqueeze(1)


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
    host tensor ops on [bs, q], and a [bs, q, C*B + q] mask made on the device.
    """
    rows = _pad_batch(seqs, batch_size)
    block_list = None
    if num_context_blocks > 0:
        block_list = _context_block_list(rows, num_context_blocks, cache)
    slot_mapping = _prompt_slot_mapping(rows, query_len, cache)
    return HpuAttentionMetadata(
        is_prompt=True,
        slot_mapping=slot_mapping.to(cache.device),
        block_list=block_list,
        attn_bias=_prompt_attn_bias(rows, query_len, num_context_blocks, cache),
        query_lens=torch.tensor([row.num_scheduled_tokens for row in rows]).to(
            cache.device
        ),
    )


def build_decode_metadata(
    seqs: list[SeqLayout], batch_size: int, num_blocks: int, cache: CacheGeometry
) -> HpuAttentionMetadata:
    """Metadata of a decode pass of ``batch_size`` tokens over ``num_blocks`` (P)
    flat blocks (spec section 2).

    Cost: O(P + batch_size) Python list work, four host-to-device copies and a few
    small device ops ([P, block_size] bias, [P, bs] one-hot).
    """
    rows = _pad_batch(seqs, batch_size)
    block_size, dummy_block = cache.block_size, cache.num_blocks
    block_list: list[int] = []
    block_groups: list[int] = []
    block_usage: list[int] = []
    slots: list[int] = []
    for i, seq in enumerate(seqs):
        seq_len = seq.num_computed_tokens + 1
        n = _cdiv(seq_len, block_size)
        block_list += seq.block_table[:n]
        block_groups += [i] * n
        block_usage += [block_size] * (n - 1) + [seq_len - (n - 1) * block_size]
        pos = seq.num_computed_tokens
        slots.append(seq.block_table[pos // block_size] * block_size + pos % block_size)
    if len(block_list) > num_blocks:
        raise ValueError(
            f"decode batch needs {len(block_list)} blocks but num_blocks={num_blocks};"
            " pick a larger bucket."
        )
    pad = num_blocks - len(block_list)
    slots += [
        dummy_block * block_size + i % block_size for i in range(len(seqs), len(rows))
    ]
    return _decode_metadata(
        slots,
        block_list + [dummy_block] * pad,
        block_groups + [batch_size] * pad,
        block_usage + [1] * pad,
        cache,
    )


def _decode_metadata(
    slots: list[int],
    block_list: list[int],
    block_groups: list[int],
    block_usage: list[int],
    cache: CacheGeometry,
) -> HpuAttentionMetadata:
    batch_size = len(slots)
    groups = torch.tensor(block_groups, dtype=torch.long).to(cache.device)
    usage = torch.tensor(block_usage, dtype=torch.long).to(cache.device)
    offsets = torch.arange(cache.block_size, device=cache.device)
    bias = torch.zeros(
        (len(block_list), cache.block_size), dtype=cache.dtype, device=cache.device
    )
    bias.masked_fill_(offsets[None, :] >= usage[:, None], float("-inf"))
    mapping = torch.nn.functional.one_hot(groups, batch_size + 1)[:, :batch_size]
    return HpuAttentionMetadata(
        is_prompt=False,
        slot_mapping=torch.tensor(slots, dtype=torch.long).to(cache.device),
        block_list=torch.tensor(block_list, dtype=torch.long).to(cache.device),
        block_groups=groups,
        block_mapping=mapping.to(cache.dtype),
        block_bias=bias,
    )
