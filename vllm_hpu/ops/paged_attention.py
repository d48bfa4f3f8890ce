"""Decode attention over all blocks of a batch laid on one padded axis ("flat").

A long and a short sequence in one batch do not pad each other: shapes depend
only on (batch_size, num_blocks P, block_size), which is what Gaudi graphs need.
A batch of many blocks may be read a slice of blocks at a time, the slices
merged through each row's log-sum-exp (VLLM_HPU_DECODE_BLOCK_SLICE): a layer
then holds the keys and values of one slice, not a copy of the batch's whole KV.
"""

from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import torch

from vllm_hpu.ops.attention_kernels import PLAIN, AttentionKernels
from vllm_hpu.ops.score_mods import Scoring, alibi_bias, soft_cap
from vllm_hpu.ops.sliced_attention import merge_tiles

LOW_PRECISION = (torch.bfloat16, torch.float16)
ALL_BLOCKS = 2**62  # a block slice that never cuts


@dataclass
class DecodeBlocks:
    """The flat block layout of a decode batch of ``bs`` rows and ``P`` blocks.

    Padding blocks read the dummy block, belong to the sink row ``bs`` and have
    one valid token, so every block has a finite maximum score. A windowed layer
    gets its own layout: only blocks inside the window, and -inf before its start.
    """

    block_list: torch.Tensor  # [P] long: physical block id
    block_groups: torch.Tensor  # [P] long: owning batch row; padding -> bs
    block_mapping: torch.Tensor  # [P, bs] one-hot of block_groups, sink dropped
    # [P, block_size] (or [P, num_heads, block_size] with ALiBi): 0 for valid
    # tokens, -inf for tokens past the end or before the window.
    block_bias: torch.Tensor
    block_offsets: torch.Tensor  # [P] long: block's first key position - query's

    def split(self, size: int) -> list["DecodeBlocks"]:
        """The layout cut along P into slices of ``size`` blocks (the last
        shorter); each slice keeps its blocks' rows."""
        num_blocks = self.block_list.shape[0]
        return [
            DecodeBlocks(
                **{
                    f.name: getattr(self, f.name)[start : start + size]
                    for f in fields(self)
                }
            )
            for start in range(0, num_blocks, size)
        ]


def blocks_with_alibi(blocks: DecodeBlocks, slopes: torch.Tensor) -> DecodeBlocks:
    """The blocks with ALiBi in their bias, now per head: [P, num_heads, B] fp32.
    slopes: [num_heads] fp32 on the blocks' device."""
    bias = blocks.block_bias
    slots = torch.arange(bias.shape[-1], device=bias.device)
    distance = blocks.block_offsets[:, None] + slots[None, :]
    return replace(blocks, block_bias=bias[:, None, :] + alibi_bias(slopes, distance))


def score_dtype(dtype: torch.dtype) -> torch.dtype:
    """Softmax statistics stay in fp32 when the model runs in 16 bits."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def _rows(
    values: torch.Tensor, block_groups: torch.Tensor, num_rows: int, reduce: str
) -> torch.Tensor:
    """``values`` [P, X] reduced per owning row -> [num_rows, X]. A row without
    blocks gets the most negative finite value (amax) or 0 (sum)."""
    init = torch.finfo(values.dtype).min if reduce == "amax" else 0.0
    rows = values.new_full((num_rows, values.shape[1]), init)
    index = block_groups[:, None].expand_as(values)
    return rows.scatter_reduce_(0, index, values, reduce, include_self=True)


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    blocks: DecodeBlocks,
    scoring: Scoring,
    kernels: AttentionKernels = PLAIN,
    block_slice: int = ALL_BLOCKS,
) -> torch.Tensor:
    """One query token per row against its sequence's cached blocks.

    query: [bs, num_heads, head_size]; caches: [slots, num_kv_heads, head_size].
    Returns [bs, num_heads, head_size] in query's dtype. Grouped-query heads share
    one K/V block through the head-group axis, never by repeating K/V. The blocks
    are read ``block_slice`` at a time."""
    block_size = blocks.block_bias.shape[-1]

    def gather(part: DecodeBlocks) -> tuple[torch.Tensor, torch.Tensor]:
        keys = kernels.fetch_keys(_by_head(key_cache, block_size), part.block_list)
        values = kernels.fetch_values(
            _by_head(value_cache, block_size), part.block_list
        )
        return keys, values

    return sliced_block_attention(query, gather, blocks, scoring, kernels, block_slice)


def sliced_block_attention(
    query: torch.Tensor,
    gather: Callable[[DecodeBlocks], tuple[torch.Tensor, torch.Tensor]],
    blocks: DecodeBlocks,
    scoring: Scoring,
    kernels: AttentionKernels,
    block_slice: int,
) -> torch.Tensor:
    """:func:`flat_block_attention` over slices of at most ``block_slice``
    blocks, each read by ``gather`` (blocks -> keys, values), merged per row by
    log-sum-exp. One slice when the batch has no more blocks than that."""
    if blocks.block_list.shape[0] <= block_slice:
        return flat_block_attention(query, *gather(blocks), blocks, scoring, kernels)
    merged = None
    for part in blocks.split(block_slice):
        out, lse = flat_block_attention_lse(
            query, *gather(part), part, scoring, kernels
        )
        merged = merge_tiles(merged, (out.float(), lse))
    assert merged is not None
    return merged[0].to(query.dtype)


def _by_head(cache: torch.Tensor, block_size: int) -> torch.Tensor:
    """A flat cache as blocks [num_blocks + 1, num_kv_heads, block_size, head_size]:
    a selection of them is one contiguous copy, ready for a matmul."""
    return cache.unflatten(0, (-1, block_size)).transpose(1, 2)


def flat_block_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    blocks: DecodeBlocks,
    scoring: Scoring,
    kernels: AttentionKernels = PLAIN,
) -> torch.Tensor:
    """The flat kernel on gathered blocks. keys: [P, num_kv_heads, block_size,
    head_size]; values: [P, num_kv_heads, block_size, value_size] (a value may be
    a slice of its key, as MLA's latent is). Returns [bs, num_heads, value_size].
    Scores are scaled, soft-capped (``scoring``), then biased (``block_bias``)."""
    return flat_block_attention_lse(query, keys, values, blocks, scoring, kernels)[0]


def flat_block_attention_lse(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    blocks: DecodeBlocks,
    scoring: Scoring,
    kernels: AttentionKernels = PLAIN,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`flat_block_attention`, and each row's log-sum-exp of its scores
    [bs, num_heads] (fp32 for 16-bit models); a row without blocks has output 0
    and a log-sum-exp at the dtype's most negative value."""
    bs, num_heads, head_size = query.shape
    num_blocks, block_size = blocks.block_bias.shape[0], blocks.block_bias.shape[-1]
    num_kv_heads = keys.shape[1]
    group = num_heads // num_kv_heads
    acc_dtype = score_dtype(query.dtype)

    # batch2block: each block gets its row's query.
    q = torch.matmul(blocks.block_mapping, (query * scoring.scale).reshape(bs, -1))
    q = q.view(num_blocks, num_kv_heads, group, head_size)

    scores = kernels.matmul_qk(q, keys.to(q.dtype).transpose(-1, -2)).to(
        acc_dtype
    )  # [P, KVH, G, B]
    scores = soft_cap(scores, scoring.logits_soft_cap)
    bias_heads = (num_kv_heads, group) if blocks.block_bias.dim() == 3 else (1, 1)
    scores = scores + blocks.block_bias.to(acc_dtype).view(
        num_blocks, *bias_heads, block_size
    )
    block_max = scores.amax(dim=-1, keepdim=True)
    probs = torch.exp(scores - block_max)
    block_sum = probs.sum(dim=-1, keepdim=True)
    block_out = kernels.matmul_av(probs.to(query.dtype), values.to(query.dtype))

    # Rescale every block to its row's maximum; the sink row absorbs padding.
    block_max = block_max.view(num_blocks, num_heads)
    row_max = _rows(block_max, blocks.block_groups, bs + 1, "amax")
    adjust = torch.exp(block_max - row_max.index_select(0, blocks.block_groups))
    row_sum = _rows(
        block_sum.view(num_blocks, num_heads) * adjust,
        blocks.block_groups,
        bs + 1,
        "sum",
    )
    block_sum = row_sum.index_select(0, blocks.block_groups)
    weight = (adjust / block_sum).view(num_blocks, num_kv_heads, group, 1)
    block_out = (block_out.to(acc_dtype) * weight).to(query.dtype)

    # block2batch: sum each row's rescaled blocks; padding blocks have no column.
    out = torch.matmul(blocks.block_mapping.t(), block_out.view(num_blocks, -1))
    tiny = torch.finfo(row_sum.dtype).tiny
    lse = row_max[:bs] + torch.log(row_sum[:bs].clamp_min(tiny))
    return out.view(bs, num_heads, values.shape[-1]), lse
