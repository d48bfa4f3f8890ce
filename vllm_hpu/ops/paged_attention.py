"""Decode attention over all blocks of a batch laid on one padded axis ("flat"):
sequences do not pad each other, and shapes depend only on (batch_size,
num_blocks P, block_size), as Gaudi graphs need. Many blocks may be read a slice
at a time, merged by each row's log-sum-exp (VLLM_HPU_DECODE_BLOCK_SLICE), so a
layer holds one slice's KV, not a copy of the batch's."""

from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import torch

from vllm_hpu.ops.attention_kernels import PLAIN, AttentionKernels
from vllm_hpu.ops.score_mods import Scoring, alibi_bias, soft_cap, with_sinks
from vllm_hpu.ops.sliced_attention import merge_tiles

LOW_PRECISION = (torch.bfloat16, torch.float16)
ALL_BLOCKS = 2**62  # a block slice that never cuts
# Hidden keys score the dtype's min, and a CPU's exp is 5-20x slower on subnormal
# results; below this floor a key weighs under 1e-34 of its block maximum.
EXP_FLOOR = -80.0


@dataclass
class DecodeBlocks:
    """Flat block layout of ``bs`` rows and ``P`` blocks; padding blocks read the
    dummy block for sink row ``bs`` with one valid token (finite maxima)."""

    block_list: torch.Tensor  # [P] long: physical block id
    block_groups: torch.Tensor  # [P] long: owning batch row; padding -> bs
    block_mapping: torch.Tensor  # [P, bs] one-hot of block_groups, sink dropped
    # [P, block_size] ([P, num_heads, block_size] with ALiBi), verification
    # [P, Q, 1 or num_heads, block_size]: 0 valid, the dtype's min hidden (a
    # finite floor: a block may hide every key from a query).
    block_bias: torch.Tensor
    block_offsets: torch.Tensor  # [P] long: block's first key position - query's
    # (verification: minus the row's first query's)

    def visible_keys(self) -> torch.Tensor:
        """Where ``block_bias`` lets a query see the key (same shape, bool)."""
        return self.block_bias > torch.finfo(self.block_bias.dtype).min

    def split(self, size: int) -> list["DecodeBlocks"]:
        """The layout cut along P into slices of ``size`` blocks."""
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
    """The blocks with ALiBi in their bias, per head: [P, num_heads, B] fp32, or
    [P, Q, num_heads, B] for ``Q`` queries per row. slopes: [num_heads] fp32."""
    bias = blocks.block_bias
    slots = torch.arange(bias.shape[-1], device=bias.device)
    distance = blocks.block_offsets[:, None] + slots[None, :]
    if bias.dim() == 2:
        return replace(
            blocks, block_bias=bias[:, None, :] + alibi_bias(slopes, distance)
        )
    queries = torch.arange(bias.shape[1], device=bias.device)
    distance = distance[:, None, :] - queries[None, :, None]
    per_head = alibi_bias(slopes, distance).transpose(1, 2)
    return replace(blocks, block_bias=bias + per_head)


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
    """One query per row (or ``Q`` causal drafts) against its blocks, ``block_slice``
    at a time: query [bs * Q, heads, D], caches [slots, kv_heads, D] -> query's
    shape; GQA heads share K/V via the head-group axis, never repeated."""
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
    """:func:`flat_block_attention` over ``gather``ed slices of <= ``block_slice``
    blocks merged by lse; sinks join each row's softmax once, after the merge."""
    if blocks.block_list.shape[0] <= block_slice:
        if scoring.sinks is None:
            return flat_block_attention(
                query, *gather(blocks), blocks, scoring, kernels
            )
        out, lse = flat_block_attention_lse(
            query, *gather(blocks), blocks, scoring, kernels
        )
        return with_sinks(out, lse, scoring.sinks)
    merged = None
    for part in blocks.split(block_slice):
        out, lse = flat_block_attention_lse(
            query, *gather(part), part, scoring, kernels
        )
        merged = merge_tiles(merged, (out.float(), lse))
    assert merged is not None
    return with_sinks(*merged, scoring.sinks).to(query.dtype)


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
    """The flat kernel on gathered blocks. keys [P, kv_heads, block_size, head_size],
    values [P, kv_heads, block_size, V] (MLA: a key slice) -> [bs, heads, V]."""
    return flat_block_attention_lse(query, keys, values, blocks, scoring, kernels)[0]


def flat_block_attention_lse(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    blocks: DecodeBlocks,
    scoring: Scoring,
    kernels: AttentionKernels = PLAIN,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`flat_block_attention` and each row's lse [bs, num_heads] (fp32 for
    16-bit models; a row without blocks: output 0, lse at the dtype's min). With
    ``Q`` queries per row ``block_bias`` is [P, Q, 1 or num_heads, block_size] and
    queries ride along the heads (``G`` becomes ``Q * G``): the kernel is unchanged."""
    bs = blocks.block_mapping.shape[1]
    num_queries = query.shape[0] // bs
    num_heads, head_size = query.shape[1:]
    num_blocks, num_kv_heads = blocks.block_bias.shape[0], keys.shape[1]
    group = num_heads // num_kv_heads * num_queries  # per block: queries x heads
    acc_dtype = score_dtype(query.dtype)

    # batch2block: each block gets its row's queries.
    q = torch.matmul(blocks.block_mapping, (query * scoring.scale).reshape(bs, -1))
    q = _queries_by_kv_head(q, num_queries, num_kv_heads, head_size)

    scores = kernels.matmul_qk(q, keys.to(q.dtype).transpose(-1, -2)).to(
        acc_dtype
    )  # [P, KVH, G, B]
    scores = _biased(soft_cap(scores, scoring.logits_soft_cap), blocks.block_bias)
    block_max = scores.amax(dim=-1, keepdim=True)
    probs = torch.exp((scores - block_max).clamp_min_(EXP_FLOOR))
    block_sum = probs.sum(dim=-1, keepdim=True)
    block_out = kernels.matmul_av(probs.to(query.dtype), values.to(query.dtype))

    # Rescale every block to its row's maximum; the sink row absorbs padding.
    block_max = block_max.view(num_blocks, -1)
    row_max = _rows(block_max, blocks.block_groups, bs + 1, "amax")
    adjust = torch.exp(block_max - row_max.index_select(0, blocks.block_groups))
    row_sum = _rows(
        block_sum.view(num_blocks, -1) * adjust, blocks.block_groups, bs + 1, "sum"
    )
    block_sum = row_sum.index_select(0, blocks.block_groups)
    weight = (adjust / block_sum).view(num_blocks, num_kv_heads, group, 1)
    block_out = (block_out.to(acc_dtype) * weight).to(query.dtype)

    # block2batch: sum each row's rescaled blocks; padding blocks have no column.
    out = torch.matmul(blocks.block_mapping.t(), block_out.view(num_blocks, -1))
    tiny = torch.finfo(row_sum.dtype).tiny
    lse = row_max[:bs] + torch.log(row_sum[:bs].clamp_min(tiny))
    out = _tokens_by_head(out.view(bs, num_kv_heads, group, -1), num_queries)
    lse = _tokens_by_head(lse.view(bs, num_kv_heads, group, 1), num_queries)
    return out, lse.squeeze(-1)


def _queries_by_kv_head(
    q: torch.Tensor, num_queries: int, num_kv_heads: int, head_size: int
) -> torch.Tensor:
    """[P, Q * num_heads * D] -> [P, KVH, Q * G, D]; one query: a view."""
    q = q.view(q.shape[0], num_queries, num_kv_heads, -1, head_size)
    return q.transpose(1, 2).reshape(q.shape[0], num_kv_heads, -1, head_size)


def _tokens_by_head(x: torch.Tensor, num_queries: int) -> torch.Tensor:
    """[bs, KVH, Q * G, X] -> [bs * Q, num_heads, X] (inverse of the above)."""
    bs, num_kv_heads, _, width = x.shape
    x = x.view(bs, num_kv_heads, num_queries, -1, width).transpose(1, 2)
    return x.reshape(bs * num_queries, -1, width)


def _biased(scores: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Scores [P, KVH, G, B] plus bias [P, B], [P, num_heads, B] (ALiBi), or per query
    [P, Q, 1 or num_heads, B] (verification; queries in G)."""
    num_blocks, num_kv_heads, group, block_size = scores.shape
    bias = bias.to(scores.dtype)
    if bias.dim() == 2:
        return scores + bias.view(num_blocks, 1, 1, block_size)
    if bias.dim() == 3:
        return scores + bias.view(num_blocks, num_kv_heads, group, block_size)
    num_queries, heads = bias.shape[1], num_kv_heads if bias.shape[2] > 1 else 1
    per_query = bias.view(num_blocks, num_queries, heads, -1, block_size)
    scores = scores.view(num_blocks, num_kv_heads, num_queries, -1, block_size)
    return (scores + per_query.transpose(1, 2)).view(
        num_blocks, num_kv_heads, group, block_size
    )
