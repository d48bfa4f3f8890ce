"""Prompt attention cut into tiles: its memory follows the tile, not the pass.

Every op's output is watched (a dispatch mode) while a long pass runs: cut, no
tensor reaches the size of one head's [q, K] scores, on every path (fused and
plain, with context, merged, MLA); whole, the same pass makes one, so the check
would fail if slicing did nothing. Values are checked against naive attention
in the op tests (test_ops_prompt_attention.py and the others' "tiles" cases).
"""

from collections.abc import Callable, Iterator

import pytest
import torch
from test_ops_prompt_attention import fused_sdpa  # noqa: F401  (fixture)
from torch.utils._python_dispatch import TorchDispatchMode

from vllm_hpu.ops.mla_kernels import (
    LatentContext,
    LatentExpansion,
    LatentKeys,
    latent_chunk_attention,
)
from vllm_hpu.ops.prompt_attention import PassKeys, prompt_attention
from vllm_hpu.ops.prompt_mask import PromptBias, PromptMask, padded_rows_mask
from vllm_hpu.ops.score_mods import Scoring
from vllm_hpu.ops.sliced_attention import (
    NO_SLICING,
    PromptSlicing,
    TileGrid,
    merge_tiles,
)

HEADS, KV_HEADS, HEAD_SIZE = 2, 1, 64
QUERY_LEN, PAST_LEN, CHUNK = 512, 512, 128
TILES = PromptSlicing(threshold=CHUNK, chunk_size=CHUNK)


class LargestOutput(TorchDispatchMode):
    """The element count of the largest tensor any op produced."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, tuple | list) else (out,):
            if isinstance(tensor, torch.Tensor):
                self.numel = max(self.numel, tensor.numel())
        return out


def _largest(run: Callable[[], torch.Tensor]) -> int:
    with LargestOutput() as watch:
        out = run()
    assert torch.isfinite(out).all()
    return watch.numel


def _inputs(past_len: int) -> tuple[torch.Tensor, PassKeys]:
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(1, QUERY_LEN, HEADS, HEAD_SIZE, generator=gen)
    current = [torch.randn(1, QUERY_LEN, KV_HEADS, HEAD_SIZE, generator=gen)] * 2
    past = [torch.randn(1, past_len, KV_HEADS, HEAD_SIZE, generator=gen)] * 2
    return query, PassKeys(*current, (past[0], past[1]) if past_len else None)


def _row_bias(past_len: int, window: int | None = None) -> PromptBias:
    lens = torch.tensor([past_len]), torch.tensor([QUERY_LEN - 3])
    mask = padded_rows_mask(*lens, QUERY_LEN, past_len)
    return PromptBias(mask, torch.float32, window)


def _merged_bias() -> PromptBias:
    """One long prompt and three short ones packed into one row."""
    owners = torch.tensor([0] * (QUERY_LEN - 96) + [1] * 32 + [2] * 32 + [3] * 32)
    positions = torch.cat([torch.arange(QUERY_LEN - 96)] + [torch.arange(32)] * 3)
    mask = PromptMask(owners[None], positions[None], owners[None], positions[None])
    return PromptBias(mask, torch.float32)


def _quadratic() -> int:
    """One head's scores over the whole pass: what slicing must never make."""
    return QUERY_LEN * (QUERY_LEN + PAST_LEN)


@pytest.fixture(params=["context", "window", "merged"])
def pass_case(request) -> Iterator[tuple[torch.Tensor, PassKeys, PromptBias]]:  # type: ignore[no-untyped-def]
    if request.param == "merged":
        yield (*_inputs(0), _merged_bias())
    else:
        window = 300 if request.param == "window" else None
        yield (*_inputs(PAST_LEN), _row_bias(PAST_LEN, window))


@pytest.mark.usefixtures("fused_sdpa")
def test_sliced_pass_never_holds_a_query_by_key_tensor(
    pass_case: tuple[torch.Tensor, PassKeys, PromptBias],
) -> None:
    query, keys, bias = pass_case
    scoring = Scoring(HEAD_SIZE**-0.5)
    whole = _largest(lambda: prompt_attention(query, keys, bias, scoring))
    cut = _largest(lambda: prompt_attention(query, keys, bias, scoring, slicing=TILES))
    pass_len = query.shape[1] * keys.num_keys
    assert whole >= pass_len  # the check sees the whole pass's mask or scores
    # The largest tensors cut: a tile's scores (heads x CHUNK x CHUNK) or the
    # pass's output and keys (tokens x heads x head size), never [q, K].
    assert cut <= max(HEADS * CHUNK * CHUNK, keys.num_keys * HEADS * HEAD_SIZE)
    assert cut < _quadratic() // 4


def test_mla_chunk_never_expands_its_context_and_cuts_its_scores() -> None:
    rank, rope, nope, v_dim, num_heads = 64, 16, 64, 64, 8
    gen = torch.Generator().manual_seed(1)
    kv_b = torch.randn(rank, num_heads * (nope + v_dim), generator=gen) * 0.1
    expand = LatentExpansion(lambda x: x @ kv_b, num_heads, rank, nope, v_dim)
    w_uk, w_uv = kv_b.view(rank, num_heads, -1).split([nope, v_dim], dim=-1)
    latent = torch.randn(1, QUERY_LEN, rank + rope, generator=gen)
    past = torch.randn(1, PAST_LEN, rank + rope, generator=gen)
    keys = LatentKeys(latent, expand, nope + rope)
    context = LatentContext(past, w_uk, w_uv)
    query = torch.randn(1, QUERY_LEN, num_heads, nope + rope, generator=gen)
    bias, scale = _row_bias(PAST_LEN), (nope + rope) ** -0.5
    whole = _largest(lambda: latent_chunk_attention(query, context, keys, bias, scale))
    cut = _largest(
        lambda: latent_chunk_attention(query, context, keys, bias, scale, TILES)
    )
    assert whole >= num_heads * _quadratic() // 2  # a head's scores over the context
    # Cut: a tile's scores, or the pass's own queries and keys (absorbed,
    # expanded): never a [q, K] tensor, nor the context expanded per head.
    own = QUERY_LEN * num_heads * (rank + rope)
    assert cut <= max(num_heads * CHUNK * CHUNK, own)
    assert cut < min(_quadratic(), PAST_LEN * num_heads * (nope + rope + v_dim))


def test_tile_grid_skips_keys_after_a_causal_tile() -> None:
    grid = TileGrid(query_len=10, past_len=6, chunk_size=4)
    assert grid.query_tiles() == [slice(0, 4), slice(4, 8), slice(8, 10)]
    # Context keys in tiles of their own; current keys up to the tile's end.
    assert grid.key_tiles(slice(4, 8)) == [
        slice(0, 4),
        slice(4, 6),
        slice(6, 10),
        slice(10, 14),
    ]
    bidirectional = TileGrid(10, 0, 4, causal=False)
    assert bidirectional.key_tiles(slice(0, 4))[-1] == slice(8, 10)


def test_merge_tiles_equals_one_softmax_and_ignores_an_empty_tile() -> None:
    gen = torch.Generator().manual_seed(2)
    scores = torch.randn(5, 12, generator=gen)
    values = torch.randn(12, 3, generator=gen)
    # The third tile's keys are all hidden (the finite minimum, as PromptBias).
    hidden = torch.full((5, 4), torch.finfo(torch.float32).min)
    parts = [(scores[:, :7], values[:7]), (scores[:, 7:], values[7:])]
    parts.append((hidden, torch.randn(4, 3, generator=gen)))
    merged = None
    for part_scores, part_values in parts:
        out = part_scores.softmax(-1) @ part_values
        lse = part_scores.logsumexp(-1)
        merged = merge_tiles(merged, (out[:, None], lse[:, None]))
    assert merged is not None
    expected = scores.softmax(-1) @ values
    torch.testing.assert_close(merged[0][:, 0], expected)
    torch.testing.assert_close(merged[1][:, 0], scores.logsumexp(-1))


def test_no_slicing_below_the_threshold() -> None:
    assert not TILES.applies(CHUNK - 1) and TILES.applies(CHUNK)
    assert not NO_SLICING.applies(10**9)
