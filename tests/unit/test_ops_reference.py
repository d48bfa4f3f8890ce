"""Naive per-sequence attention and random cache layouts, shared by the op tests.

The reference loops over sequences in Python and is checked here against torch's
own scaled_dot_product_attention, so the op tests compare with a trusted oracle.
"""

import math
import random
from dataclasses import dataclass

import pytest
import torch

from vllm_hpu.ops.kv_cache import write_to_cache


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    if dtype == torch.float32:
        return {"atol": 1e-5, "rtol": 1e-5}
    return {"atol": 2e-2, "rtol": 2e-2}


@dataclass(frozen=True)
class Variant:
    """What a layer adds to plain causal attention."""

    sliding_window: int | None = None  # keys within the last W positions only
    logits_soft_cap: float | None = None
    alibi: bool = False  # slopes from alibi_slopes(num_heads)
    sinks: bool = False  # logits from sink_logits(num_heads)
    attention_chunk: int | None = None  # keys of the query's chunk of C only

    def __str__(self) -> str:
        parts = [f"W{self.sliding_window}"] if self.sliding_window else []
        parts += [f"cap{self.logits_soft_cap}"] if self.logits_soft_cap else []
        parts += ["alibi"] if self.alibi else []
        parts += ["sinks"] if self.sinks else []
        parts += [f"chunk{self.attention_chunk}"] if self.attention_chunk else []
        return "-".join(parts) or "plain"

    def geometry_fields(self) -> dict[str, tuple[int, ...]]:
        """The CacheGeometry fields that give a layer of this variant its mask
        and decode blocks."""
        window, chunk = self.sliding_window, self.attention_chunk
        return {
            "sliding_windows": (window,) if window else (),
            "attention_chunks": (chunk,) if chunk else (),
        }


PLAIN = Variant()


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """The ALiBi paper's geometric slopes (power-of-two head counts)."""
    start = 2 ** (-8 / num_heads)
    return torch.tensor([start ** (h + 1) for h in range(num_heads)])


def sink_logits(num_heads: int) -> torch.Tensor:
    """One sink logit per head, from below to well above typical scores."""
    return torch.linspace(-1.0, 3.0, num_heads)


def naive_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    variant: Variant = PLAIN,
) -> torch.Tensor:
    """One sequence. query: [n, H, D] for the last n positions; key, value: [L, KVH,
    D] for all L positions. Causal softmax attention in fp32 -> [n, H, D], with
    the variant's window, chunk, soft-cap, ALiBi and sinks written out position by
    position."""
    n, num_heads, _ = query.shape
    length, num_kv_heads, _ = key.shape
    group = num_heads // num_kv_heads
    k = key.float().repeat_interleave(group, dim=1)
    v = value.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query.float() * scale, k)
    if variant.logits_soft_cap:
        scores = torch.tanh(scores / variant.logits_soft_cap) * variant.logits_soft_cap
    query_pos = torch.arange(length - n, length)[:, None]
    key_pos = torch.arange(length)[None, :]
    if variant.alibi:
        scores = scores + alibi_slopes(num_heads)[:, None, None] * (key_pos - query_pos)
    hidden = key_pos > query_pos
    if variant.sliding_window:
        hidden |= query_pos - key_pos >= variant.sliding_window
    if variant.attention_chunk:
        chunk = variant.attention_chunk
        hidden |= query_pos // chunk != key_pos // chunk
    scores = scores.masked_fill(hidden, -torch.inf)
    if variant.sinks:  # one more logit per head, with no value
        column = sink_logits(num_heads)[:, None, None].expand(-1, n, 1)
        weights = torch.cat((scores, column), dim=-1).softmax(-1)[..., :-1]
    else:
        weights = scores.softmax(-1)
    return torch.einsum("hqk,khd->qhd", weights, v)


@dataclass
class CacheLayout:
    """Random sequences scattered over shuffled physical blocks of a flat cache."""

    key_cache: torch.Tensor
    value_cache: torch.Tensor
    keys: list[torch.Tensor]  # per sequence [seq_len, KVH, D]
    values: list[torch.Tensor]
    block_tables: list[list[int]]
    num_blocks: int


def random_layout(
    rng: random.Random,
    seq_lens: list[int],
    block_size: int,
    shape: tuple[int, int],
    dtype: torch.dtype,
) -> CacheLayout:
    """Cache of random garbage (dummy block included) holding sequences of
    ``seq_lens`` tokens in shuffled blocks; shape is (num_kv_heads, head_size).
    Nothing is written: see :func:`fill_cache`."""
    needed = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(needed) + rng.randint(0, 3)
    ids = list(range(num_blocks))
    rng.shuffle(ids)
    tables = []
    for n in needed:
        tables.append(ids[:n])
        ids = ids[n:]
    gen = torch.Generator().manual_seed(rng.randint(0, 2**31))
    slots = (num_blocks + 1) * block_size
    caches = [10 * torch.randn(slots, *shape, generator=gen).to(dtype) for _ in "kv"]
    keys = [torch.randn(n, *shape, generator=gen).to(dtype) for n in seq_lens]
    values = [torch.randn(n, *shape, generator=gen).to(dtype) for n in seq_lens]
    return CacheLayout(caches[0], caches[1], keys, values, tables, num_blocks)


def slots_of(table: list[int], start: int, stop: int, block_size: int) -> torch.Tensor:
    slots = [
        table[p // block_size] * block_size + p % block_size for p in range(start, stop)
    ]
    return torch.tensor(slots, dtype=torch.long)


def fill_cache(layout: CacheLayout, lengths: list[int], block_size: int) -> None:
    """Write the first ``lengths[i]`` tokens of every sequence, the naive way."""
    for i, n in enumerate(lengths):
        slots = slots_of(layout.block_tables[i], 0, n, block_size)
        write_to_cache(layout.key_cache, slots, layout.keys[i][:n])
        write_to_cache(layout.value_cache, slots, layout.values[i][:n])


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("n", [1, 5, 17])
def test_ops_reference_matches_torch_sdpa(group: int, n: int) -> None:
    gen = torch.Generator().manual_seed(n * 10 + group)
    length, kv_heads, head_size = 17, 2, 64
    query = torch.randn(n, kv_heads * group, head_size, generator=gen)
    key = torch.randn(length, kv_heads, head_size, generator=gen)
    value = torch.randn(length, kv_heads, head_size, generator=gen)
    mask = torch.ones(n, length, dtype=torch.bool).tril(diagonal=length - n)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query.transpose(0, 1),
        key.repeat_interleave(group, 1).transpose(0, 1),
        value.repeat_interleave(group, 1).transpose(0, 1),
        attn_mask=mask,
        scale=0.3,
    ).transpose(0, 1)
    actual = naive_attention(query, key, value, 0.3)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("window", [None, 1, 4, 16, 40])
def test_ops_reference_window_and_alibi_match_torch_sdpa(
    window: int | None, alibi: bool
) -> None:
    gen = torch.Generator().manual_seed(7)
    n, length, num_heads, head_size = 9, 30, 4, 32
    query = torch.randn(n, num_heads, head_size, generator=gen)
    key = torch.randn(length, num_heads, head_size, generator=gen)
    value = torch.randn(length, num_heads, head_size, generator=gen)
    slopes = alibi_slopes(num_heads).tolist()
    mask = torch.full((num_heads, n, length), -torch.inf)
    for h in range(num_heads):
        for t in range(n):
            q_pos = length - n + t
            for k_pos in range(q_pos + 1):
                if window is None or q_pos - k_pos < window:
                    mask[h, t, k_pos] = slopes[h] * (k_pos - q_pos) if alibi else 0.0
    expected = torch.nn.functional.scaled_dot_product_attention(
        query.transpose(0, 1),
        key.transpose(0, 1),
        value.transpose(0, 1),
        attn_mask=mask,
        scale=0.3,
    ).transpose(0, 1)
    actual = naive_attention(query, key, value, 0.3, Variant(window, None, alibi))
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_ops_reference_soft_cap_by_hand() -> None:
    # One query, two keys, head size 1: weights are the softmax of the capped
    # scores tanh(s / cap) * cap, s = scale * q * k.
    query = torch.tensor([[[2.0]]])
    key = torch.tensor([[[3.0]], [[-1.0]]])
    value = torch.tensor([[[1.0]], [[0.0]]])
    cap = 1.5
    s0, s1 = (math.tanh(2.0 * k / cap) * cap for k in (3.0, -1.0))
    expected = math.exp(s0) / (math.exp(s0) + math.exp(s1))
    actual = naive_attention(query, key, value, 1.0, Variant(logits_soft_cap=cap))
    assert actual.item() == pytest.approx(expected, rel=1e-6)


def test_ops_reference_sinks_by_hand() -> None:
    # One query, two keys, head size 1: the sink adds exp(sink) to the
    # denominator only.
    query = torch.tensor([[[2.0]]])
    key = torch.tensor([[[0.5]], [[-1.0]]])
    value = torch.tensor([[[1.0]], [[0.0]]])
    sink = float(sink_logits(1)[0])
    s0, s1 = 2.0 * 0.5, 2.0 * -1.0
    expected = math.exp(s0) / (math.exp(s0) + math.exp(s1) + math.exp(sink))
    actual = naive_attention(query, key, value, 1.0, Variant(sinks=True))
    assert actual.item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("chunk", [1, 4, 7, 30])
def test_ops_reference_chunks_match_torch_sdpa(chunk: int) -> None:
    gen = torch.Generator().manual_seed(chunk)
    n, length, num_heads, head_size = 9, 30, 2, 16
    query = torch.randn(n, num_heads, head_size, generator=gen)
    key = torch.randn(length, num_heads, head_size, generator=gen)
    value = torch.randn(length, num_heads, head_size, generator=gen)
    mask = torch.zeros(n, length, dtype=torch.bool)
    for t in range(n):
        q_pos = length - n + t
        start = q_pos - q_pos % chunk  # the first position of the query's chunk
        mask[t, start : q_pos + 1] = True
    expected = torch.nn.functional.scaled_dot_product_attention(
        query.transpose(0, 1),
        key.transpose(0, 1),
        value.transpose(0, 1),
        attn_mask=mask,
        scale=0.3,
    ).transpose(0, 1)
    actual = naive_attention(query, key, value, 0.3, Variant(attention_chunk=chunk))
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
