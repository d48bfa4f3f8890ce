"""DeepSeek-V3.2's indexer ops vs naive per-query references: scores, each
query's top-k among the keys it sees in a prompt pass (padded rows, cached
context) and in a decode pass's flat blocks (shuffled blocks, padding blocks,
rows with fewer keys than the top-k), and the ranking within rows it uses."""

import random

import pytest
import torch
from test_ops_reference import fill_cache, random_layout

from vllm_hpu.attention.metadata import (
    CacheGeometry,
    SeqLayout,
    build_decode_metadata,
    build_prompt_metadata,
)
from vllm_hpu.ops.sparse_index import (
    decode_selection,
    index_scores,
    prompt_selection,
    rank_within_rows,
)

HEADS, HEAD_DIM = 4, 8
CPU = torch.device("cpu")


def naive_scores(query: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor):
    """One query [H, D], weights [H], keys [K, D] -> [K]: sum_h w_h relu(q_h.k)."""
    return sum(
        weights[h] * torch.relu(keys.double() @ query[h].double()) for h in range(HEADS)
    )


def naive_top_k(scores: torch.Tensor, k: int) -> set[int]:
    return set(scores.topk(min(k, scores.shape[0])).indices.tolist())


def test_index_scores_match_naive():
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(2, 3, HEADS, HEAD_DIM, generator=gen)
    weights = torch.randn(2, 3, HEADS, generator=gen)
    keys = torch.randn(2, 7, HEAD_DIM, generator=gen)
    scores = index_scores(query, weights, keys)
    assert scores.shape == (2, 3, 7) and scores.dtype == torch.float32
    for b in range(2):
        for t in range(3):
            expected = naive_scores(query[b, t], weights[b, t], keys[b])
            torch.testing.assert_close(scores[b, t], expected.float())


def test_rank_within_rows_matches_naive():
    gen = torch.Generator().manual_seed(1)
    scores = torch.randn(40, generator=gen)
    scores[::7] = float("-inf")
    owner = torch.randint(0, 4, (40,), generator=gen)
    rank = rank_within_rows(scores, owner, 5)
    for row in range(5):
        (members,) = torch.nonzero(owner == row, as_tuple=True)
        ordered = sorted(members.tolist(), key=lambda i: (-scores[i].item(), i))
        assert [rank[i].item() for i in ordered] == list(range(len(ordered)))


@pytest.mark.parametrize("index_topk", [3, 9, 64])
def test_prompt_selection_matches_naive(index_topk: int):
    """Padded rows of a pass with cached context: each real query keeps its
    ``index_topk`` best keys among its context and the pass's tokens up to it."""
    block_size, contexts, queries = 4, [5, 0, 11], [6, 3, 9]
    gen = torch.Generator().manual_seed(index_topk)
    tables = [list(range(i * 8, i * 8 + 8)) for i in range(3)]
    seqs = [
        SeqLayout(t, c, q) for t, c, q in zip(tables, contexts, queries, strict=True)
    ]
    cache = CacheGeometry(block_size, 24, torch.float32, CPU)
    metadata = build_prompt_metadata(seqs, 4, 9, 3, cache)
    mask = metadata.prompt_mask
    assert mask is not None
    num_keys = mask.num_keys  # 3 context blocks of 4, then the 9 queries
    query = torch.randn(4, 9, HEADS, HEAD_DIM, generator=gen)
    weights = torch.randn(4, 9, HEADS, generator=gen)
    keys = torch.randn(4, num_keys, HEAD_DIM, generator=gen)
    visible = mask.allowed(slice(0, 9), slice(0, num_keys))
    chosen = prompt_selection(query, weights, keys, visible, index_topk)
    past = num_keys - 9
    for b, (context, length) in enumerate(zip(contexts, queries, strict=True)):
        seen = [*range(context)]
        for t in range(length):
            seen.append(past + t)
            scores = naive_scores(query[b, t], weights[b, t], keys[b, seen])
            expected = {seen[i] for i in naive_top_k(scores, index_topk)}
            assert set(torch.nonzero(chosen[b, t]).flatten().tolist()) == expected


@pytest.mark.parametrize("index_topk", [2, 10, 100])
def test_decode_selection_matches_naive(index_topk: int):
    """Each row's query keeps its best keys of its cached sequence, wherever
    its blocks sit; padding blocks keep at most their one token."""
    rng = random.Random(index_topk)
    block_size, seq_lens = 4, [1, 6, 13, 9]
    layout = random_layout(rng, seq_lens, block_size, (1, HEAD_DIM), torch.float32)
    fill_cache(layout, seq_lens, block_size)
    cache = layout.key_cache[:, 0]  # [slots, D]: the indexer's keys
    seqs = [
        SeqLayout(t, n - 1, 1)
        for t, n in zip(layout.block_tables, seq_lens, strict=True)
    ]
    geometry = CacheGeometry(block_size, layout.num_blocks, torch.float32, CPU)
    blocks = build_decode_metadata(seqs, 5, 12, geometry).decode_blocks()
    gen = torch.Generator().manual_seed(index_topk)
    query = torch.randn(5, HEADS, HEAD_DIM, generator=gen)
    weights = torch.randn(5, HEADS, generator=gen)
    chosen = decode_selection(query, weights, cache, blocks, index_topk)
    assert chosen.shape == blocks.block_bias.shape
    for row, n in enumerate(seq_lens):
        scores = naive_scores(query[row], weights[row], layout.keys[row][:, 0])
        expected = naive_top_k(scores, index_topk)
        got = set()
        for j in torch.nonzero(blocks.block_groups == row).flatten().tolist():
            first = int(blocks.block_offsets[j]) + n - 1  # the block's first position
            got |= {first + s for s in range(block_size) if chosen[j, s]}
        assert got == expected, row
    padding = blocks.block_groups == 5
    assert int(chosen[padding].sum(dim=-1).max()) <= 1
