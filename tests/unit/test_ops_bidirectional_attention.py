"""Encoder-only (bidirectional) prompt attention vs naive full attention per row.

Used by pooling models whose decoder layers run non-causally (``is_causal:
false``); rows of mixed lengths padded to one query length, fused and unfused.
"""

import pytest
import torch
from test_ops_prompt_attention import (  # noqa: F401  (fixtures, used below)
    fused_sdpa,
    slicing,
)
from test_ops_reference import tolerance

from vllm_hpu.ops.prompt_attention import PassKeys, prompt_attention
from vllm_hpu.ops.prompt_mask import PromptBias, padded_rows_mask
from vllm_hpu.ops.score_mods import Scoring
from vllm_hpu.ops.sliced_attention import PromptSlicing


def bidirectional_bias(
    query_lens: torch.Tensor, query_len: int, dtype: torch.dtype
) -> PromptBias:
    mask = padded_rows_mask(
        torch.zeros_like(query_lens), query_lens, query_len, 0, causal=False
    )
    return PromptBias(mask, dtype)


def naive_full_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float
) -> torch.Tensor:
    """One row. query: [n, H, D]; key, value: [n, KVH, D]. Every token sees every
    token, softmax in fp32 -> [n, H, D]."""
    group = query.shape[1] // key.shape[1]
    k = key.float().repeat_interleave(group, dim=1)
    v = value.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query.float() * scale, k)
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


@pytest.mark.usefixtures("fused_sdpa")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("query_lens", [[1], [5, 32, 17], [32, 32]])
def test_bidirectional_attention_matches_naive(
    query_lens: list[int],
    group: int,
    dtype: torch.dtype,
    slicing: PromptSlicing,  # noqa: F811
) -> None:
    torch.manual_seed(0)
    batch_size, query_len = len(query_lens) + 1, 32  # one padding row
    num_kv_heads, head_size = 2, 64
    shape = (batch_size, query_len)
    query = torch.randn(*shape, num_kv_heads * group, head_size).to(dtype)
    key = torch.randn(*shape, num_kv_heads, head_size).to(dtype)
    value = torch.randn(*shape, num_kv_heads, head_size).to(dtype)
    lens = torch.tensor([*query_lens, 0])
    scale = head_size**-0.5

    bias = bidirectional_bias(lens, query_len, dtype)
    out = prompt_attention(
        query, PassKeys(key, value), bias, Scoring(scale), slicing=slicing
    )

    assert torch.isfinite(out).all(), "padded rows and tokens must stay finite"
    for i, n in enumerate(query_lens):
        expected = naive_full_attention(query[i, :n], key[i, :n], value[i, :n], scale)
        torch.testing.assert_close(out[i, :n].float(), expected, **tolerance(dtype))


def test_bidirectional_bias_shows_real_tokens_and_the_diagonal() -> None:
    bias = bidirectional_bias(torch.tensor([2, 0]), 3, torch.float32).whole()
    visible = (bias == 0).squeeze(1).int().tolist()
    assert visible == [
        [[1, 1, 0], [1, 1, 0], [0, 0, 1]],
        [[1, 0, 0], [0, 1, 0], [0, 0, 1]],
    ]
