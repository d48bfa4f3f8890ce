"""The double's kernels against naive references on the CPU, and the card
generation's fp8 range: Gaudi2's e4m3 stops at 240 (vllm-gaudi 091bbad
extension/ops.py:25-30), Gaudi3's is OCP e4m3fn (448)."""

import pytest
import torch
import torch.nn.functional as F
from double_process import run_double


def _hpu(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to("hpu") for t in tensors]


def _attention(q, k, v, mask, scale):
    """Grouped-query attention, K/V heads repeated, on the CPU."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-1, -2) * scale + mask
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("recompute", [True, False])
def test_fused_sdpa_matches_attention_with_grouped_heads(bridge, recompute):
    from habana_frameworks.torch.hpex.kernels import FusedSDPA

    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    causal = torch.full((5, 5), float("-inf")).triu(1)
    out = FusedSDPA.apply(*_hpu(q, k, v), None, 0.0, True, 0.3, "None", recompute)
    torch.testing.assert_close(out.cpu(), _attention(q, k, v, causal, 0.3))
    mask = torch.randn(2, 1, 5, 5)
    out = FusedSDPA.apply(*_hpu(q, k, v, mask), 0.0, False, 0.3, "None", recompute)
    torch.testing.assert_close(out.cpu(), _attention(q, k, v, mask, 0.3))


def test_sdpa_recomp_fwd_statistics_give_the_log_sum_exp(bridge):
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    mask = torch.zeros(1, 1, 3, 3)
    out, m, linv, _ = torch.ops.hpu.sdpa_recomp_fwd(
        *_hpu(q, k, v, mask), 0.0, 0.5, False, True, "None", None, "right"
    )
    lse = m.cpu().float() - torch.log(linv.cpu())
    expected = torch.logsumexp(q @ k.transpose(-1, -2) * 0.5, dim=-1, keepdim=True)
    torch.testing.assert_close(lse, expected)
    torch.testing.assert_close(out.cpu(), _attention(q, k, v, mask, 0.5))


def _rotate_half(x):
    first, second = x.chunk(2, -1)
    return torch.cat((-second, first), -1)


def _rotate_pairs(x):
    return torch.stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)


@pytest.mark.parametrize("mode", ["BLOCKWISE", "PAIRWISE"])
def test_rotary_embedding_rotates_halves_or_pairs(bridge, mode):
    from habana_frameworks.torch.hpex.kernels import (
        RotaryPosEmbeddingMode,
        apply_rotary_pos_emb,
    )

    x, cos, sin = torch.randn(5, 3, 8), torch.randn(5, 1, 8), torch.randn(5, 1, 8)
    rope_mode = RotaryPosEmbeddingMode[mode]
    out = apply_rotary_pos_emb(*_hpu(x, cos, sin), None, 0, rope_mode)
    rotate = _rotate_half if mode == "BLOCKWISE" else _rotate_pairs
    torch.testing.assert_close(out.cpu(), x * cos + rotate(x) * sin)


def test_fused_rms_norm(bridge):
    from habana_frameworks.torch.hpex.normalization import FusedRMSNorm

    x, weight = torch.randn(4, 16), torch.randn(16)
    out = FusedRMSNorm.apply(*_hpu(x, weight), 1e-5)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight
    torch.testing.assert_close(out.cpu(), expected)


def _experts(x, ids, weights, gate_up, down):
    """The routed MLPs token by token: sum of w * down(silu(gate) * up)."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for slot in range(ids.shape[1]):
            e = int(ids[t, slot])
            gate, up = (x[t] @ gate_up[e].T).chunk(2)
            out[t] += weights[t, slot] * (F.silu(gate) * up) @ down[e].T
    return out


def test_fused_moe_routes_tokens_to_their_experts(bridge):
    tokens, hidden, inter, experts = 6, 8, 4, 3
    x = torch.randn(tokens, hidden)
    ids = torch.randint(0, experts, (tokens, 2))
    weights = torch.rand(tokens, 2)
    gate_up = torch.randn(experts, 2 * inter, hidden)
    down = torch.randn(experts, hidden, inter)
    out = torch.ops.hpu.mixture_of_experts(
        hidden_states=x.to("hpu"),
        expert_routing_table=ids.to("hpu"),
        router_weights=weights.to("hpu"),
        w12=[w.to("hpu") for w in gate_up],
        w3=[w.to("hpu") for w in down],
        permuted_weights=True,
        activation="silu",
        experts_min=0,
        experts_max=experts - 1,
    )
    torch.testing.assert_close(out.cpu(), _experts(x, ids, weights, gate_up, down))


def test_fp8_gemm_scales_rows_and_output_columns(bridge):
    a = torch.randn(3, 8).to(torch.float8_e4m3fn)
    b = torch.randn(8, 5).to(torch.float8_e4m3fn)
    row_scale, column_scale = torch.rand(3, 1) + 0.5, torch.rand(5) + 0.5
    expected = (a.float() * row_scale) @ b.float() * column_scale
    for columns in (column_scale, column_scale.reshape(1, 5)):
        out = torch.ops.hpu.fp8_gemm_v2(
            *_hpu(a), False, *_hpu(b), False, None, torch.float32,
            *_hpu(row_scale, columns), None, False,
        )  # fmt: skip
        torch.testing.assert_close(out.cpu(), expected)


def test_fp8_gemm_refuses_a_per_channel_scale_shaped_as_rows(bridge):
    """The review's D8: an [N, 1] B scale is not per output column."""
    a, b = (
        torch.randn(4, 4).to(torch.float8_e4m3fn),
        torch.randn(4, 4).to(torch.float8_e4m3fn),
    )
    with pytest.raises(RuntimeError, match="B_scale_inv of shape"):
        torch.ops.hpu.fp8_gemm_v2(
            *_hpu(a), False, *_hpu(b), False, None, torch.float32,
            None, torch.ones(4, 1, device="hpu"), None, False,
        )  # fmt: skip


FP8_RANGE_SCRIPT = """
import torch, habana_frameworks.torch
values = torch.tensor([300.0, -1000.0, 100.0], device="hpu")
cast = torch.ops.hpu.cast_to_fp8_v2(values, None, False, False, torch.float8_e4m3fn)[0]
print("cast", cast.float().cpu().tolist())
checkpoint = torch.tensor([448.0, 256.0, 240.0]).to(torch.float8_e4m3fn).to("hpu")
read = torch.ops.hpu.cast_from_fp8(checkpoint, None, torch.float32)
print("read", read.cpu().tolist())
print("upcast", checkpoint.to(torch.bfloat16).float().cpu().tolist())
"""


@pytest.mark.parametrize(
    ("device", "cast", "read"),
    [
        ("gaudi2", "[240.0, -240.0, 96.0]", "[nan, nan, 240.0]"),
        ("gaudi3", "[288.0, -448.0, 96.0]", "[448.0, 256.0, 240.0]"),
    ],
)
def test_fp8_range_follows_the_card_generation(device, cast, read):
    out = run_double(FP8_RANGE_SCRIPT, HPU_DOUBLE_DEVICE=device)
    assert f"cast {cast}" in out
    assert f"read {read}" in out
    assert f"upcast {read}" in out
