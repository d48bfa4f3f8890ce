"""Multi-query flat paged attention (verification of drafts, with its metadata
builder) vs naive attention: each row's ``q <= Q`` new tokens after contexts of
mixed lengths (empty, inside a block, on a block boundary), causal among
themselves, short rows packed together into groups of ``Q`` slots; plain,
windowed, chunked, soft-capped, ALiBi and sinks; all blocks at once and 3 at
a time."""

import random

import pytest
import torch
from test_ops_reference import (
    PLAIN,
    Variant,
    alibi_slopes,
    fill_cache,
    naive_attention,
    random_layout,
    sink_logits,
    tolerance,
)

from vllm_hpu.attention.metadata import CacheGeometry, SeqLayout, build_decode_metadata
from vllm_hpu.attention.verify import num_groups, pack_rows
from vllm_hpu.ops.kv_cache import write_to_cache
from vllm_hpu.ops.paged_attention import ALL_BLOCKS, blocks_with_alibi, paged_attention
from vllm_hpu.ops.score_mods import Scoring

BLOCK_SIZE = 16
NUM_QUERIES = 4  # k = 3 drafts and the last sampled token
VARIANTS = [
    PLAIN,
    Variant(sliding_window=5),
    Variant(sliding_window=17),
    Variant(attention_chunk=16),
    Variant(attention_chunk=6),
    Variant(logits_soft_cap=2.0),
    Variant(alibi=True),
    Variant(sinks=True),
]


def _contexts(rng: random.Random, count: int) -> list[int]:
    """Context lengths: empty, on a block boundary, just before one, or any."""
    picks = [0, BLOCK_SIZE, 3 * BLOCK_SIZE - 1, 2 * BLOCK_SIZE - 2]
    return [rng.choice([*picks, rng.randint(1, 60)]) for _ in range(count)]


@pytest.mark.parametrize("block_slice", [ALL_BLOCKS, 3], ids=["whole", "slices"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_verify_attention_matches_naive(
    variant: Variant, dtype: torch.dtype, block_slice: int
) -> None:
    for seed, group in enumerate((1, 4)):
        _check_verify(seed, group, variant, dtype, block_slice)


def test_hidden_keys_weigh_nothing() -> None:
    """Hidden keys' probabilities are floored for the CPU's exp
    (ops/paged_attention.py, EXP_FLOOR), not zeroed: even values 1e20 times
    the visible ones' in every hidden slot change no output."""
    for seed, group in enumerate((1, 4)):
        _check_verify(seed, group, PLAIN, torch.float32, ALL_BLOCKS, garbage=1e20)


def _check_verify(
    seed: int,
    group: int,
    variant: Variant,
    dtype: torch.dtype,
    block_slice: int,
    garbage: float = 1.0,
) -> None:
    """``garbage`` scales the values of the cache slots no row sees."""
    rng = random.Random(seed)
    num_kv_heads, head_size, batch_size = 2, 32, 6
    num_heads = num_kv_heads * group
    contexts = _contexts(rng, batch_size)
    query_lens = [rng.randint(1, NUM_QUERIES) for _ in contexts]
    query_lens[0] = NUM_QUERIES
    seq_lens = [c + q for c, q in zip(contexts, query_lens, strict=True)]
    layout = random_layout(rng, seq_lens, BLOCK_SIZE, (num_kv_heads, head_size), dtype)
    layout.value_cache.mul_(garbage)
    fill_cache(layout, contexts, BLOCK_SIZE)
    seqs = [
        SeqLayout(table, c, q)
        for table, c, q in zip(layout.block_tables, contexts, query_lens, strict=True)
    ]
    starts = pack_rows(query_lens, NUM_QUERIES)
    padded_batch = num_groups(starts, NUM_QUERIES) + 1
    local = variant.sliding_window or variant.attention_chunk
    geometry = CacheGeometry(
        BLOCK_SIZE,
        layout.num_blocks,
        dtype,
        torch.device("cpu"),
        full_attention=not local,
        **variant.geometry_fields(),
    )
    used_blocks = sum(len(t) for t in layout.block_tables)
    metadata = build_decode_metadata(
        seqs, padded_batch, used_blocks + 2, geometry, starts, NUM_QUERIES
    )
    assert not metadata.is_prompt
    assert metadata.slot_mapping.shape == (padded_batch * NUM_QUERIES,)
    # The pass's own tokens go into the cache first, through its slot_mapping.
    shape = (padded_batch * NUM_QUERIES, num_kv_heads, head_size)
    new_kv = [torch.randn(shape).to(dtype) for _ in "kv"]
    for i, (c, q) in enumerate(zip(contexts, query_lens, strict=True)):
        rows = slice(starts[i], starts[i] + q)
        new_kv[0][rows], new_kv[1][rows] = layout.keys[i][c:], layout.values[i][c:]
    write_to_cache(layout.key_cache, metadata.slot_mapping, new_kv[0])
    write_to_cache(layout.value_cache, metadata.slot_mapping, new_kv[1])
    blocks = metadata.decode_blocks(variant.sliding_window, variant.attention_chunk)
    if variant.alibi:
        blocks = blocks_with_alibi(blocks, alibi_slopes(num_heads))
    query = torch.randn(padded_batch * NUM_QUERIES, num_heads, head_size).to(dtype)
    scale = head_size**-0.5
    sinks = sink_logits(num_heads).to(dtype) if variant.sinks else None
    out = paged_attention(
        query,
        layout.key_cache,
        layout.value_cache,
        blocks,
        Scoring(scale, variant.logits_soft_cap, use_fused=False, sinks=sinks),
        block_slice=block_slice,
    )

    assert out.shape == query.shape and out.dtype == dtype
    for i, q in enumerate(query_lens):
        rows = slice(starts[i], starts[i] + q)
        expected = naive_attention(
            query[rows], layout.keys[i], layout.values[i], scale, variant
        )
        torch.testing.assert_close(
            out[rows].float(),
            expected,
            **tolerance(dtype),
            msg=lambda m, i=i: (
                f"{variant} seed {seed} row {i} "
                f"(context {contexts[i]}, {query_lens[i]} queries): {m}"
            ),
        )


def test_verify_metadata_refuses_rows_beyond_its_queries() -> None:
    geometry = CacheGeometry(BLOCK_SIZE, 4, torch.float32, torch.device("cpu"))
    seq = SeqLayout([0, 1], BLOCK_SIZE, NUM_QUERIES + 1)
    with pytest.raises(ValueError, match="do not fit 4 queries per row"):
        pack_rows([NUM_QUERIES + 1], NUM_QUERIES)
    with pytest.raises(ValueError, match="do not fit the 4 slots"):
        build_decode_metadata([seq], 1, 4, geometry, [0], NUM_QUERIES)


def test_short_rows_share_query_groups() -> None:
    """First fit in row order: a full row takes a group; short rows fill the
    first group with room for all their tokens."""
    assert pack_rows([4, 1, 4, 2, 1, 3, 1], 4) == [0, 4, 8, 5, 7, 12, 15]
    assert num_groups([0, 4, 8, 5, 7, 12, 15], 4) == 4
    assert pack_rows([1, 1, 1, 1, 1], 4) == [0, 1, 2, 3, 4]
