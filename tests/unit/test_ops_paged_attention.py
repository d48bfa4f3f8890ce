"""Flat paged decode attention (with its metadata builder) vs naive attention,
plain and with sliding windows, logit soft-capping and ALiBi; all blocks at
once and 3 blocks at a time (VLLM_HPU_DECODE_BLOCK_SLICE), so slices split
rows and leave padding rows and the sink row without blocks."""

import random
from dataclasses import dataclass

import pytest
import torch
from test_ops_reference import (
    PLAIN,
    Variant,
    alibi_slopes,
    fill_cache,
    naive_attention,
    random_layout,
    tolerance,
)

from vllm_hpu.attention.metadata import (
    CacheGeometry,
    SeqLayout,
    build_decode_metadata,
)
from vllm_hpu.ops.kv_cache import write_to_cache
from vllm_hpu.ops.paged_attention import (
    ALL_BLOCKS,
    DecodeBlocks,
    blocks_with_alibi,
    paged_attention,
)
from vllm_hpu.ops.score_mods import Scoring

NUM_CASES = 48
BLOCK_SLICES = [ALL_BLOCKS, 3]


@dataclass(frozen=True)
class DecodeCase:
    seed: int
    block_size: int
    group: int
    head_size: int
    dtype: torch.dtype
    batch_size: int  # real rows; the bucket may add padding rows

    def __str__(self) -> str:
        return (
            f"seed{self.seed}-B{self.block_size}-G{self.group}-D{self.head_size}"
            f"-{str(self.dtype).removeprefix('torch.')}-bs{self.batch_size}"
        )


def _cases() -> list[DecodeCase]:
    rng = random.Random(1234)
    return [
        DecodeCase(
            seed=seed,
            block_size=rng.choice([16, 128]),
            group=[1, 2, 4, 8][seed % 4],
            head_size=rng.choice([64, 128]),
            dtype=[torch.float32, torch.bfloat16][(seed // 4) % 2],
            batch_size=rng.randint(1, 16),
        )
        for seed in range(NUM_CASES)
    ]


def _seq_lens(rng: random.Random, count: int, block_size: int) -> list[int]:
    """Lengths of 1 .. 4 blocks, a third of them exact multiples of the block."""
    lens = []
    for _ in range(count):
        blocks = rng.randint(1, 4)
        exact = rng.random() < 0.33
        lens.append(
            blocks * block_size if exact else rng.randint(1, blocks * block_size)
        )
    return lens


@pytest.mark.parametrize("block_slice", BLOCK_SLICES, ids=["whole", "slices"])
@pytest.mark.parametrize("case", _cases(), ids=str)
def test_paged_attention_matches_naive(case: DecodeCase, block_slice: int) -> None:
    _check_decode(case, PLAIN, block_slice)


# Windows below, at and above the block size (16) and the sequence lengths
# (1 .. 64 tokens), aligned to blocks and not; soft-cap; ALiBi.
VARIANTS = [
    Variant(sliding_window=1),
    Variant(sliding_window=5),
    Variant(sliding_window=16),
    Variant(sliding_window=17),
    Variant(sliding_window=40),
    Variant(sliding_window=64),
    Variant(sliding_window=1000),
    Variant(logits_soft_cap=2.0),
    Variant(sliding_window=20, logits_soft_cap=2.0),
    Variant(alibi=True),
]


@pytest.mark.parametrize("block_slice", BLOCK_SLICES, ids=["whole", "slices"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_paged_attention_variants_match_naive(
    variant: Variant, dtype: torch.dtype, block_slice: int
) -> None:
    for seed in range(3):
        case = DecodeCase(
            seed=seed,
            block_size=16,
            group=[1, 2, 4][seed],
            head_size=[64, 40, 32][seed],
            dtype=dtype,
            batch_size=[1, 5, 12][seed],
        )
        _check_decode(case, variant, block_slice)


# The widest heads the backend accepts (DeepSeek's 192, Gemma's 256). Decode has
# one kernel, fused or not, since the fused kernel is the prompt's.
@pytest.mark.parametrize("head_size", [192, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_paged_attention_wide_heads_match_naive(
    head_size: int, dtype: torch.dtype
) -> None:
    for seed, group in enumerate((1, 4)):
        case = DecodeCase(seed, 16, group, head_size, dtype, batch_size=[3, 9][seed])
        _check_decode(case, PLAIN, ALL_BLOCKS)


def _check_decode(case: DecodeCase, variant: Variant, block_slice: int) -> None:
    rng = random.Random(case.seed)
    num_kv_heads = rng.choice([1, 2])
    num_heads = num_kv_heads * case.group
    seq_lens = _seq_lens(rng, case.batch_size, case.block_size)
    layout = random_layout(
        rng, seq_lens, case.block_size, (num_kv_heads, case.head_size), case.dtype
    )
    fill_cache(layout, [n - 1 for n in seq_lens], case.block_size)
    seqs = [
        SeqLayout(table, n - 1, 1)
        for table, n in zip(layout.block_tables, seq_lens, strict=True)
    ]
    padded_batch = case.batch_size + rng.randint(0, 2)
    windows = (variant.sliding_window,) if variant.sliding_window else ()
    # A windowed model alone: no full-attention layout is built.
    geometry = CacheGeometry(
        case.block_size,
        layout.num_blocks,
        case.dtype,
        torch.device("cpu"),
        sliding_windows=windows,
        full_attention=not windows,
    )
    used_blocks = sum(len(t) for t in layout.block_tables)
    metadata = build_decode_metadata(
        seqs, padded_batch, used_blocks + rng.randint(0, 5), geometry
    )
    query = torch.randn(padded_batch, num_heads, case.head_size).to(case.dtype)
    # The step's own token goes in through the metadata's slot_mapping.
    new_kv = [
        torch.randn(padded_batch, num_kv_heads, case.head_size).to(case.dtype)
        for _ in "kv"
    ]
    for i in range(case.batch_size):
        new_kv[0][i], new_kv[1][i] = layout.keys[i][-1], layout.values[i][-1]
    write_to_cache(layout.key_cache, metadata.slot_mapping, new_kv[0])
    write_to_cache(layout.value_cache, metadata.slot_mapping, new_kv[1])
    scale = case.head_size**-0.5
    blocks = metadata.decode_blocks(variant.sliding_window)
    _assert_reads_only_visible_blocks(blocks, layout.num_blocks)
    if variant.alibi:
        blocks = blocks_with_alibi(blocks, alibi_slopes(num_heads))

    out = paged_attention(
        query,
        layout.key_cache,
        layout.value_cache,
        blocks,
        Scoring(scale, variant.logits_soft_cap, use_fused=False),
        block_slice=block_slice,
    )

    assert out.shape == query.shape and out.dtype == case.dtype
    assert torch.isfinite(out).all(), f"{case}: non-finite output"
    for i, n in enumerate(seq_lens):
        expected = naive_attention(
            query[i : i + 1], layout.keys[i], layout.values[i], scale, variant
        )
        torch.testing.assert_close(
            out[i : i + 1].float(),
            expected,
            **tolerance(case.dtype),
            msg=lambda m, i=i, n=n: f"{case} {variant} row {i} (seq_len {n}): {m}",
        )


def _assert_reads_only_visible_blocks(blocks: DecodeBlocks, dummy: int) -> None:
    """Every real block in the list has a visible token: none fell out."""
    real = blocks.block_list != dummy
    visible = (blocks.block_bias == 0).any(-1)
    assert visible[real].all(), "a block outside the window is read"
