"""Prompt attention, with and without cached context, vs naive attention.

Each case builds the metadata with build_prompt_metadata and writes the current
tokens through its slot_mapping first, as the attention impl does. Cases run with
the fused kernel (torch's, in emulation) and with VLLM_PROMPT_USE_FUSEDSDPA=0,
plain and with sliding windows, logit soft-capping and ALiBi, each whole and cut
into tiles of 7 queries x 7 keys (ops/sliced_attention.py), so tiles straddle
blocks, rows and windows.
"""

import random
from collections.abc import Iterator
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

from vllm_hpu import device, envs
from vllm_hpu.attention.metadata import CacheGeometry, SeqLayout, build_prompt_metadata
from vllm_hpu.ops.kv_cache import write_to_cache
from vllm_hpu.ops.prompt_attention import PassKeys, gather_context, prompt_attention
from vllm_hpu.ops.prompt_mask import PromptBias
from vllm_hpu.ops.score_mods import Scoring
from vllm_hpu.ops.sliced_attention import NO_SLICING, PromptSlicing

NUM_CASES = 40
# Every pass cut into tiles of 7 queries x 7 keys: misaligned with blocks.
SMALL_TILES = PromptSlicing(threshold=1, chunk_size=7)


@dataclass(frozen=True)
class PromptCase:
    seed: int
    block_size: int
    group: int
    head_size: int
    dtype: torch.dtype
    batch_size: int
    with_context: bool

    def __str__(self) -> str:
        return (
            f"seed{self.seed}-B{self.block_size}-G{self.group}-D{self.head_size}"
            f"-{str(self.dtype).removeprefix('torch.')}-bs{self.batch_size}"
            f"-{'ctx' if self.with_context else 'noctx'}"
        )


def _cases() -> list[PromptCase]:
    rng = random.Random(99)
    return [
        PromptCase(
            seed=seed,
            block_size=rng.choice([16, 16, 128]),
            group=[1, 2, 4, 8][seed % 4],
            head_size=rng.choice([64, 128]),
            dtype=[torch.float32, torch.bfloat16][(seed // 4) % 2],
            batch_size=rng.randint(1, 16) if seed % 3 else rng.randint(1, 4),
            with_context=seed % 2 == 1,
        )
        for seed in range(NUM_CASES)
    ]


def _request_shapes(
    rng: random.Random, case: PromptCase
) -> tuple[list[int], list[int]]:
    """(context lengths, query lengths): contexts of 0..2 blocks, some exact."""
    block_size = case.block_size
    max_query = rng.choice([block_size, 2 * block_size]) if block_size == 16 else 40
    contexts, queries = [], []
    for _ in range(case.batch_size):
        blocks = rng.randint(0, 2) if case.with_context else 0
        exact = rng.random() < 0.4
        contexts.append(
            blocks * block_size if exact else rng.randint(0, blocks * block_size)
        )
        queries.append(max_query if rng.random() < 0.3 else rng.randint(1, max_query))
    return contexts, queries


@pytest.fixture(params=[True, False], ids=["fused", "unfused"])
def fused_sdpa(request, monkeypatch) -> Iterator[bool]:
    """VLLM_PROMPT_USE_FUSEDSDPA on or off, with the kernel looked up afresh."""
    monkeypatch.setenv("VLLM_PROMPT_USE_FUSEDSDPA", str(int(request.param)))
    monkeypatch.setattr(device, "_KERNELS", {})
    envs.get_envs.cache_clear()
    yield request.param
    envs.get_envs.cache_clear()


@pytest.fixture(params=[NO_SLICING, SMALL_TILES], ids=["whole", "tiles"])
def slicing(request) -> PromptSlicing:  # type: ignore[no-untyped-def]
    return request.param


@pytest.mark.parametrize("case", _cases(), ids=str)
def test_prompt_attention_matches_naive(
    case: PromptCase, fused_sdpa: bool, slicing: PromptSlicing
) -> None:
    assert (device.fused_sdpa() is not None) == fused_sdpa
    _check_prompt(case, PLAIN, use_fused=True, slicing=slicing)


# Windows below, at and above the block size (16) and the context + query
# lengths (1 .. 64 tokens), aligned to blocks and not; soft-cap; ALiBi.
VARIANTS = [
    Variant(sliding_window=1),
    Variant(sliding_window=5),
    Variant(sliding_window=16),
    Variant(sliding_window=17),
    Variant(sliding_window=40),
    Variant(sliding_window=1000),
    Variant(logits_soft_cap=2.0),
    Variant(sliding_window=20, logits_soft_cap=2.0),
    Variant(alibi=True),
    Variant(sliding_window=9, alibi=True),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_prompt_attention_variants_match_naive(
    variant: Variant, dtype: torch.dtype, fused_sdpa: bool, slicing: PromptSlicing
) -> None:
    for seed in range(2):
        case = PromptCase(
            seed=seed,
            block_size=16,
            group=[1, 4][seed],
            head_size=[40, 64][seed],
            dtype=dtype,
            batch_size=[3, 6][seed],
            with_context=True,
        )
        # The impl's choice: soft-cap and ALiBi always take the plain path.
        plain_only = variant.logits_soft_cap is not None or variant.alibi
        _check_prompt(case, variant, not plain_only, slicing)


# The widest heads the backend accepts: DeepSeek's 192-wide MLA queries (its
# prompts expand the latent to ordinary heads), Gemma 2 9B's and Gemma 3's 256.
@pytest.mark.parametrize("head_size", [192, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("with_context", [False, True], ids=["noctx", "ctx"])
def test_prompt_attention_wide_heads_match_naive(
    head_size: int,
    dtype: torch.dtype,
    with_context: bool,
    fused_sdpa: bool,
    slicing: PromptSlicing,
) -> None:
    case = PromptCase(
        seed=head_size,
        block_size=16,
        group=2,
        head_size=head_size,
        dtype=dtype,
        batch_size=3,
        with_context=with_context,
    )
    _check_prompt(case, PLAIN, use_fused=True, slicing=slicing)


def _check_prompt(
    case: PromptCase, variant: Variant, use_fused: bool, slicing: PromptSlicing
) -> None:
    rng = random.Random(case.seed)
    num_kv_heads = rng.choice([1, 2])
    num_heads = num_kv_heads * case.group
    contexts, queries = _request_shapes(rng, case)
    seq_lens = [c + q for c, q in zip(contexts, queries, strict=True)]
    layout = random_layout(
        rng, seq_lens, case.block_size, (num_kv_heads, case.head_size), case.dtype
    )
    fill_cache(layout, contexts, case.block_size)
    seqs = [
        SeqLayout(t, c, q)
        for t, c, q in zip(layout.block_tables, contexts, queries, strict=True)
    ]
    batch_size = case.batch_size + rng.randint(0, 2)
    query_len = max(queries) + rng.randint(0, 7)
    context_blocks = -(-max(contexts) // case.block_size)
    context_blocks += (
        rng.randint(0 if context_blocks else 1, 2) if case.with_context else 0
    )
    windows = (variant.sliding_window,) if variant.sliding_window else ()
    geometry = CacheGeometry(
        case.block_size,
        layout.num_blocks,
        case.dtype,
        torch.device("cpu"),
        sliding_windows=windows,
    )
    metadata = build_prompt_metadata(
        seqs, batch_size, query_len, context_blocks, geometry
    )

    shape = (batch_size, query_len)
    query = torch.randn(*shape, num_heads, case.head_size).to(case.dtype)
    key = torch.randn(*shape, num_kv_heads, case.head_size).to(case.dtype)
    value = torch.randn(*shape, num_kv_heads, case.head_size).to(case.dtype)
    for i, (c, q) in enumerate(zip(contexts, queries, strict=True)):
        key[i, :q] = layout.keys[i][c:]
        value[i, :q] = layout.values[i][c:]
    write_to_cache(layout.key_cache, metadata.slot_mapping, key.flatten(0, 1))
    write_to_cache(layout.value_cache, metadata.slot_mapping, value.flatten(0, 1))
    past_kv = None
    if metadata.block_list is not None:
        past_kv = gather_context(
            layout.key_cache,
            layout.value_cache,
            metadata.block_list,
            batch_size,
            case.block_size,
        )
    assert metadata.prompt_mask is not None
    slopes = alibi_slopes(num_heads) if variant.alibi else None
    bias = PromptBias(metadata.prompt_mask, case.dtype, variant.sliding_window, slopes)
    scale = case.head_size**-0.5
    scoring = Scoring(scale, variant.logits_soft_cap, use_fused)

    keys = PassKeys(key, value, past_kv)
    out = prompt_attention(query, keys, bias, scoring, slicing=slicing)

    assert out.shape == query.shape and out.dtype == case.dtype
    assert torch.isfinite(out).all(), f"{case}: non-finite output (padding rows?)"
    for i, (c, q) in enumerate(zip(contexts, queries, strict=True)):
        expected = naive_attention(
            query[i, :q], layout.keys[i], layout.values[i], scale, variant
        )
        torch.testing.assert_close(
            out[i, :q].float(),
            expected,
            **tolerance(case.dtype),
            msg=lambda m, i=i, c=c, q=q: (
                f"{case} {variant} row {i} (ctx {c}, q {q}): {m}"
            ),
        )
