"""DeepSeek-V3.2's lightning indexer: each query scores the keys it may see and
attends only its ``index_topk`` best, scored as transformers'
``DeepseekV32Indexer`` does, in fp32 (vLLM's CUDA kernels use fp8). The top-k
runs over the bucket's padded key axis, hidden keys at -inf."""

import torch

from vllm_hpu.ops.kv_cache import gather_blocks
from vllm_hpu.ops.paged_attention import DecodeBlocks


def index_scores(
    query: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor
) -> torch.Tensor:
    """query [..., Q, H, D], weights [..., Q, H] (softmax and head scales folded),
    keys [..., K, D] -> [..., Q, K] fp32: sum over heads of weight * relu(q . k)."""
    keys = keys.float().transpose(-1, -2).unsqueeze(-3)  # [..., 1, D, K]
    scores = torch.matmul(query.float(), keys).relu_()  # [..., Q, H, K]
    return torch.matmul(weights.float().unsqueeze(-2), scores).squeeze(-2)


def top_k_keys(scores: torch.Tensor, visible: torch.Tensor, k: int) -> torch.Tensor:
    """[..., K] bool: the ``k`` best-scored visible keys (all where fewer)."""
    scores = scores.masked_fill(~visible, float("-inf"))
    index = scores.topk(min(k, scores.shape[-1]), dim=-1).indices
    return torch.zeros_like(visible).scatter_(-1, index, True) & visible


def prompt_selection(
    query: torch.Tensor,
    weights: torch.Tensor,
    keys: torch.Tensor,
    visible: torch.Tensor,
    index_topk: int,
) -> torch.Tensor:
    """A prompt pass's chosen keys: query [bs, q, H, D], weights [bs, q, H], keys
    [bs, K, D] (context, then own), visible [bs, q, K] -> [bs, q, K] bool."""
    return top_k_keys(index_scores(query, weights, keys), visible, index_topk)


def decode_selection(
    query: torch.Tensor,
    weights: torch.Tensor,
    cache: torch.Tensor,
    blocks: DecodeBlocks,
    index_topk: int,
) -> torch.Tensor:
    """A decode pass's chosen keys in its flat layout. query [bs, H, D], weights
    [bs, H], cache [slots, D] -> [P, block_size] bool; keys are ranked within each
    row, so no row holds an axis as long as the batch's keys."""
    num_blocks, block_size = blocks.block_bias.shape
    keys = gather_blocks(cache, blocks.block_list, block_size)  # [P, B, D]
    mapping = blocks.block_mapping.float()  # each block gets its row's query
    block_query = mapping @ query.float().flatten(1)
    block_query = block_query.view(num_blocks, 1, -1, keys.shape[-1])
    block_weights = (mapping @ weights.float()).unsqueeze(1)
    scores = index_scores(block_query, block_weights, keys).flatten()
    visible = blocks.visible_keys().flatten()
    owner = blocks.block_groups.repeat_interleave(block_size)
    num_rows = blocks.block_mapping.shape[1] + 1  # and the padding blocks' sink row
    rank = rank_within_rows(
        scores.masked_fill(~visible, float("-inf")), owner, num_rows
    )
    return (visible & (rank < index_topk)).view(num_blocks, block_size)


def rank_within_rows(
    scores: torch.Tensor, owner: torch.Tensor, num_rows: int
) -> torch.Tensor:
    """scores [N], row owner [N] (< num_rows) -> each score's rank in its row, 0 best,
    ties in axis order: two stable sorts, by score then by row."""
    order = scores.argsort(descending=True, stable=True)
    order = order[owner[order].argsort(stable=True)]
    positions = torch.arange(scores.shape[0], device=scores.device)
    # bincount's length would depend on the values: a static scatter instead.
    counts = positions.new_zeros(num_rows).scatter_add_(
        0, owner, torch.ones_like(positions)
    )
    starts = counts.cumsum(0) - counts
    rank_in_order = positions - starts[owner[order]]
    return torch.empty_like(positions).scatter_(0, order, rank_in_order)
