"""MLA ops on the flat latent cache vs naive multi-head attention on the
expanded latent (no absorption): decode in latent space, prompts without
context, prompt chunks with their context in latent space merged with their own
tokens, whole and cut into tiles.

The reference expands every cached latent through kv_b_proj into per-head keys
and values, as transformers' DeepseekV2 does, and attends per sequence.
"""

import random
from dataclasses import dataclass, replace

import pytest
import torch
from test_ops_prompt_attention import fused_sdpa, slicing  # noqa: F401  (fixtures)
from test_ops_reference import fill_cache, naive_attention, random_layout, tolerance

from vllm_hpu.attention.metadata import (
    CacheGeometry,
    SeqLayout,
    build_decode_metadata,
    build_prompt_metadata,
)
from vllm_hpu.ops.mla_kernels import (
    LatentContext,
    LatentExpansion,
    LatentKeys,
    gather_latent_context,
    latent_chunk_attention,
    latent_decode_attention,
    latent_prompt_attention,
    write_latent_to_cache,
)
from vllm_hpu.ops.prompt_mask import PromptBias
from vllm_hpu.ops.sliced_attention import PromptSlicing, TileGrid

NUM_HEADS = 4
CPU = torch.device("cpu")
# (kv_lora_rank L, rope R, qk_nope P, v_head V): V below P + R as in DeepSeek,
# and V above it, so that both ways of padding to one head size run.
DIMS = [(64, 16, 32, 32), (32, 8, 16, 48)]


@dataclass(frozen=True)
class MlaCase:
    seed: int
    block_size: int
    dims: tuple[int, int, int, int]
    dtype: torch.dtype

    def __str__(self) -> str:
        dims = "-".join(map(str, self.dims))
        return (
            f"seed{self.seed}-B{self.block_size}-{dims}"
            f"-{str(self.dtype).removeprefix('torch.')}"
        )


CASES = [
    MlaCase(seed, block_size, dims, dtype)
    for seed, (block_size, dims, dtype) in enumerate(
        (b, d, t)
        for b in (16, 128)
        for d in DIMS
        for t in (torch.float32, torch.bfloat16)
    )
]


@dataclass
class Weights:
    """kv_b_proj's weight [N * (P + V), L] and its W_UK [L, N, P], W_UV [L, N, V]."""

    kv_b: torch.Tensor
    w_uk: torch.Tensor
    w_uv: torch.Tensor
    expand: LatentExpansion


def make_weights(case: MlaCase, gen: torch.Generator) -> Weights:
    rank, _, nope, v_dim = case.dims
    kv_b = torch.randn(NUM_HEADS * (nope + v_dim), rank, generator=gen) * rank**-0.5
    kv_b = kv_b.to(case.dtype)
    w_uk, w_uv = kv_b.t().reshape(rank, NUM_HEADS, -1).split([nope, v_dim], dim=-1)
    expand = LatentExpansion(
        kv_b_proj=lambda x: x @ kv_b.t(),
        num_heads=NUM_HEADS,
        kv_lora_rank=rank,
        qk_nope_head_dim=nope,
        v_head_dim=v_dim,
    )
    return Weights(kv_b, w_uk, w_uv, expand)


def naive_mla(
    query: torch.Tensor, latent: torch.Tensor, weights: Weights, scale: float
) -> torch.Tensor:
    """One sequence, non-absorbed. query: [n, N, P + R] for the last n positions;
    latent: [length, L + R]. Returns [n, N, V] in fp32."""
    rank = weights.w_uk.shape[0]
    kv_c, k_pe = latent.float().split([rank, latent.shape[-1] - rank], dim=-1)
    kv = (kv_c @ weights.kv_b.float().t()).view(latent.shape[0], NUM_HEADS, -1)
    k_nope, value = kv.split([weights.w_uk.shape[-1], weights.w_uv.shape[-1]], -1)
    key = torch.cat((k_nope, k_pe[:, None].expand(-1, NUM_HEADS, -1)), dim=-1)
    return naive_attention(query, key, value, scale)


def latent_layout(rng: random.Random, seq_lens: list[int], case: MlaCase):
    """A latent cache of garbage, sequences in shuffled blocks, [slots, L + R]."""
    rank, rope = case.dims[:2]
    layout = random_layout(rng, seq_lens, case.block_size, (1, rank + rope), case.dtype)
    latents = [k[:, 0] for k in layout.keys]  # [length, L + R] per sequence
    return layout, layout.key_cache[:, 0], latents


@pytest.mark.parametrize("block_slice", [2**62, 2], ids=["whole", "slices"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_latent_decode_attention_matches_naive(case: MlaCase, block_slice: int) -> None:
    rng = random.Random(case.seed)
    gen = torch.Generator().manual_seed(case.seed)
    rank, rope, nope, _ = case.dims
    batch_size = rng.randint(1, 6)
    seq_lens = [rng.randint(1, 3 * case.block_size) for _ in range(batch_size)]
    layout, cache, latents = latent_layout(rng, seq_lens, case)
    fill_cache(layout, [n - 1 for n in seq_lens], case.block_size)
    weights = make_weights(case, gen)
    seqs = [
        SeqLayout(t, n - 1, 1)
        for t, n in zip(layout.block_tables, seq_lens, strict=True)
    ]
    geometry = CacheGeometry(case.block_size, layout.num_blocks, case.dtype, CPU)
    used = sum(len(t) for t in layout.block_tables)
    metadata = build_decode_metadata(seqs, batch_size + 1, used + 3, geometry)
    # The step's own token goes in through the metadata's slot_mapping.
    new = torch.randn(batch_size + 1, rank + rope, generator=gen).to(case.dtype)
    for i, latent in enumerate(latents):
        new[i] = latent[-1]
    write_latent_to_cache(cache, metadata.slot_mapping, new[:, :rank], new[:, rank:])
    q_nope = torch.randn(batch_size + 1, NUM_HEADS, nope, generator=gen)
    q_pe = torch.randn(batch_size + 1, NUM_HEADS, rope, generator=gen)
    q_nope, q_pe = q_nope.to(case.dtype), q_pe.to(case.dtype)
    scale = (nope + rope) ** -0.5

    # W_UK absorbed into the query and W_UV applied after, as vLLM's layer does.
    q_latent = torch.einsum("bnp,lnp->bnl", q_nope, weights.w_uk)
    out = latent_decode_attention(
        torch.cat((q_latent, q_pe), dim=-1),
        cache,
        metadata.decode_blocks(),
        scale,
        rank,
        block_slice,
    )
    assert out.shape == (batch_size + 1, NUM_HEADS, rank) and out.dtype == case.dtype
    assert torch.isfinite(out).all()
    out = torch.einsum("bnl,lnv->bnv", out.float(), weights.w_uv.float())
    query = torch.cat((q_nope, q_pe), dim=-1)
    for i, latent in enumerate(latents):
        expected = naive_mla(query[i : i + 1], latent, weights, scale)
        torch.testing.assert_close(
            out[i : i + 1], expected, **tolerance(case.dtype), msg=f"{case} row {i}"
        )


@dataclass
class PromptPass:
    """A padded prompt pass: each row's context and query lengths, its latents
    (context then queries) and the pass's inputs to the ops."""

    contexts: list[int]
    queries: list[int]
    latents: list[torch.Tensor]
    query: torch.Tensor  # [bs, q, N, P + R]
    latent: torch.Tensor  # [bs, q, L + R], the pass's own tokens
    past: torch.Tensor | None  # [bs, C * B, L + R], gathered from the cache
    bias: PromptBias


def prompt_pass(case: MlaCase, rng: random.Random, contexts: list[int]) -> PromptPass:
    gen = torch.Generator().manual_seed(case.seed)
    rank, rope, nope, _ = case.dims
    batch_size = len(contexts)
    queries = [rng.randint(1, 40) for _ in range(batch_size)]
    seq_lens = [c + q for c, q in zip(contexts, queries, strict=True)]
    layout, cache, latents = latent_layout(rng, seq_lens, case)
    fill_cache(layout, contexts, case.block_size)
    seqs = [
        SeqLayout(t, c, q)
        for t, c, q in zip(layout.block_tables, contexts, queries, strict=True)
    ]
    geometry = CacheGeometry(case.block_size, layout.num_blocks, case.dtype, CPU)
    query_len = max(queries) + rng.randint(0, 5)
    # With context, the pass may read one more (padding) block than it needs.
    context_blocks = -(-max(contexts) // case.block_size)
    context_blocks += rng.randint(0, 1) if context_blocks else 0
    metadata = build_prompt_metadata(
        seqs, batch_size + 1, query_len, context_blocks, geometry
    )
    latent = torch.randn(batch_size + 1, query_len, rank + rope, generator=gen)
    latent = latent.to(case.dtype)
    for i, (c, q) in enumerate(zip(contexts, queries, strict=True)):
        latent[i, :q] = latents[i][c:]
    write_latent_to_cache(
        cache, metadata.slot_mapping, *latent.flatten(0, 1).split([rank, rope], -1)
    )
    past = None
    if metadata.block_list is not None:
        past = gather_latent_context(
            cache, metadata.block_list, batch_size + 1, case.block_size
        )
    query = torch.randn(
        batch_size + 1, query_len, NUM_HEADS, nope + rope, generator=gen
    )
    assert metadata.prompt_mask is not None
    bias = PromptBias(metadata.prompt_mask, case.dtype)
    return PromptPass(
        contexts, queries, latents, query.to(case.dtype), latent, past, bias
    )


def check_against_naive(
    case: MlaCase, batch: PromptPass, weights: Weights, out: torch.Tensor
) -> None:
    v_dim = case.dims[3]
    assert out.shape == (*batch.query.shape[:3], v_dim) and out.dtype == case.dtype
    assert torch.isfinite(out).all(), f"{case}: non-finite output (padding rows?)"
    scale = (case.dims[2] + case.dims[1]) ** -0.5
    rows = zip(batch.contexts, batch.queries, batch.latents, strict=True)
    for i, (c, q, latents) in enumerate(rows):
        expected = naive_mla(batch.query[i, :q], latents, weights, scale)
        torch.testing.assert_close(
            out[i, :q].float(),
            expected,
            **tolerance(case.dtype),
            msg=f"{case} row {i} (ctx {c}, q {q})",
        )


def counting_rows(expand: LatentExpansion, rows: list[int]) -> LatentExpansion:
    """``expand`` recording how many latent rows go through kv_b_proj."""

    def kv_b_proj(kv_c: torch.Tensor) -> torch.Tensor:
        rows.append(kv_c.shape[0])
        return expand.kv_b_proj(kv_c)

    return replace(expand, kv_b_proj=kv_b_proj)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_latent_prompt_attention_matches_naive(
    case: MlaCase,
    fused_sdpa: bool,  # noqa: F811
    slicing: PromptSlicing,  # noqa: F811
) -> None:
    """A pass without cached context: its own latents expanded."""
    rng = random.Random(case.seed)
    batch = prompt_pass(case, rng, [0] * rng.randint(1, 4))
    weights = make_weights(case, torch.Generator().manual_seed(case.seed + 100))
    nope, v_dim = case.dims[2:]
    keys = LatentKeys(batch.latent, weights.expand, max(sum(case.dims[1:3]), v_dim))
    scale = (nope + case.dims[1]) ** -0.5

    out = latent_prompt_attention(batch.query, keys, batch.bias, scale, slicing)

    check_against_naive(case, batch, weights, out)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_latent_chunk_attention_matches_naive(
    case: MlaCase,
    fused_sdpa: bool,  # noqa: F811
    slicing: PromptSlicing,  # noqa: F811
) -> None:
    """A pass with cached context (rows with none among them): the context in
    latent space through W_UK and W_UV, merged with the pass's own tokens by
    log-sum-exp; kv_b_proj sees the pass's own tokens only."""
    rng = random.Random(case.seed)
    contexts = [rng.choice([case.block_size, rng.randint(1, 40)])]
    contexts += [rng.choice([0, rng.randint(1, 40)]) for _ in range(rng.randint(0, 3))]
    batch = prompt_pass(case, rng, contexts)
    weights = make_weights(case, torch.Generator().manual_seed(case.seed + 100))
    _, rope, nope, v_dim = case.dims
    rows: list[int] = []
    expand = counting_rows(weights.expand, rows)
    keys = LatentKeys(batch.latent, expand, max(nope + rope, v_dim))
    assert batch.past is not None
    context = LatentContext(batch.past, weights.w_uk, weights.w_uv)

    out = latent_chunk_attention(
        batch.query, context, keys, batch.bias, (nope + rope) ** -0.5, slicing
    )

    check_against_naive(case, batch, weights, out)
    assert sum(rows) == len(batch.latent) * own_keys_read(batch, slicing)


def own_keys_read(batch: PromptPass, cut: PromptSlicing) -> int:
    """Keys of the pass's own tokens each row's tiles read (what kv_b_proj may
    expand): a causal query tile reads them up to its last query."""
    assert batch.past is not None
    past_len, query_len = batch.past.shape[1], batch.query.shape[1]
    num_keys = past_len + query_len
    chunk = cut.chunk_size if cut.applies(num_keys) else num_keys
    grid = TileGrid(query_len, past_len, chunk)
    return sum(
        keys.stop - keys.start
        for queries in grid.query_tiles()
        for keys in grid.key_tiles(queries)
        if keys.start >= past_len
    )
