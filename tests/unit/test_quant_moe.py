"""Quantized experts without an engine: groups of experts add up to all of them,
fp8 inputs and block scales against naive references, and the variants refused
at start-up name themselves."""

from types import SimpleNamespace

import pytest
import torch
from compressed_tensors.quantization import QuantizationArgs

from vllm_hpu.ops import fused_moe
from vllm_hpu.ops.moe import fused_experts
from vllm_hpu.quantization import moe_methods
from vllm_hpu.quantization.fp8_moe import (
    PER_TENSOR,
    PER_TOKEN,
    STATIC,
    dequantize_w13_blocks,
    quantize_input,
)
from vllm_hpu.quantization.moe_configs import (
    HpuCompressedTensorsConfig,
    compressed_tensors_method,
)

NUM_TOKENS, HIDDEN, INTERMEDIATE, NUM_EXPERTS, TOP_K = 6, 32, 16, 8, 2


def _experts() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    x = torch.randn(NUM_TOKENS, HIDDEN)
    w13 = torch.randn(NUM_EXPERTS, 2 * INTERMEDIATE, HIDDEN) * 0.2
    w2 = torch.randn(NUM_EXPERTS, HIDDEN, INTERMEDIATE) * 0.2
    ids = torch.stack([torch.randperm(NUM_EXPERTS)[:TOP_K] for _ in range(NUM_TOKENS)])
    return x, w13, w2, torch.rand(NUM_TOKENS, TOP_K), ids


@pytest.mark.parametrize("group", [1, 3, 5])
def test_groups_of_experts_add_up_to_all_of_them(group):
    x, w13, w2, weights, ids = _experts()
    want = fused_experts(x, w13, w2, weights, ids)
    parts = [
        fused_experts(
            x,
            w13[first : first + group],
            w2[first : first + group],
            weights,
            ids,
            experts_min=first,
            num_experts=NUM_EXPERTS,
        )
        for first in range(0, NUM_EXPERTS, group)
    ]
    torch.testing.assert_close(sum(parts), want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(parts[0], want)


class _Dequantized(moe_methods.HpuQuantizedMoE):
    """Experts kept in float32, 'dequantized' by slicing; counts the groups."""

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor) -> None:
        self.w13, self.w2, self.groups = w13, w2, []

    def dequantize(self, layer, experts, dtype):  # type: ignore[no-untyped-def]
        if isinstance(experts, slice):
            self.groups.append((experts.start, experts.stop))
        else:
            self.groups.append(experts.tolist())
        return self.w13[experts].to(dtype), self.w2[experts].to(dtype)


def _layer() -> SimpleNamespace:
    return SimpleNamespace(
        local_num_experts=NUM_EXPERTS,
        hidden_size=HIDDEN,
        intermediate_size_per_partition=INTERMEDIATE,
        activation=SimpleNamespace(value="silu"),
        swiglu_alpha=None,
        swiglu_limit=None,
    )


def test_experts_dequantize_in_groups_of_bounded_bytes(monkeypatch):
    x, w13, w2, weights, ids = _experts()
    layer = _layer()
    method = _Dequantized(w13, w2)
    one_expert = 3 * HIDDEN * INTERMEDIATE * 4  # float32 bytes
    monkeypatch.setattr(fused_moe, "EXPERT_GROUP_BYTES", 3 * one_expert)
    out = method.run_experts(layer, x, weights, ids)
    assert method.groups == [(0, 3), (3, 6), (6, 8)]
    want = fused_experts(x, w13, w2, weights, ids)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_a_decode_token_dequantizes_its_routed_experts_only():
    """One token, top 2 of 8 experts: the two routed experts are dequantized,
    not the eight, and the output is the same."""
    x, w13, w2, weights, ids = _experts()
    method = _Dequantized(w13, w2)
    out = method.run_experts(_layer(), x[:1], weights[:1], ids[:1])
    assert method.groups == [sorted(ids[0].tolist())]
    want = fused_experts(x[:1], w13, w2, weights[:1], ids[:1])
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", [STATIC, PER_TENSOR, PER_TOKEN])
def test_quantize_input_scales_as_asked(mode):
    x = torch.randn(5, 64) * torch.arange(1, 6)[:, None]
    q, scale = quantize_input(x, mode, torch.tensor(0.01))
    expected = {
        STATIC: torch.tensor(0.01),
        PER_TENSOR: x.abs().amax() / 448,
        PER_TOKEN: x.abs().amax(-1, keepdim=True) / 448,
    }[mode]
    torch.testing.assert_close(scale, expected)
    assert q.dtype == torch.float8_e4m3fn
    inside = (x / scale).abs() <= 448
    error = (q.float() * scale - x)[inside.expand_as(x)].abs().max()
    assert error <= 0.07 * x.abs().max()


def test_w13_blocks_are_per_shard_with_partial_edges():
    """Intermediate 24 with blocks of 16: each half has a partial row of blocks."""
    torch.manual_seed(0)
    weight = torch.randn(2, 48, 40).to(torch.float8_e4m3fn)
    scale = torch.rand(2, 4, 3)  # 2 shards x ceil(24 / 16) rows, ceil(40 / 16) cols
    got = dequantize_w13_blocks(weight, scale, (16, 16), torch.float32)
    rows = torch.arange(48)
    block_rows = (rows // 24) * 2 + (rows % 24) // 16
    block_cols = torch.arange(40) // 16
    want = weight.float() * scale[:, block_rows][:, :, block_cols]
    torch.testing.assert_close(got, want)


def _args(**kwargs) -> QuantizationArgs:  # type: ignore[no-untyped-def]
    return QuantizationArgs(**kwargs)


INT8_TOKEN = _args(num_bits=8, type="int", strategy="token", dynamic=True)


@pytest.mark.parametrize(
    ("weights", "inputs", "error"),
    [
        (
            _args(num_bits=8, type="int", strategy="channel"),
            INT8_TOKEN,
            "weights int8 channel, activations int8 dynamic token",
        ),
        (
            _args(num_bits=4, type="float", strategy="group", group_size=32),
            _args(num_bits=4, type="float", strategy="group", group_size=32),
            "MXFP4 experts with quantized activations",
        ),
        (
            _args(num_bits=8, type="float", strategy="channel"),
            None,
            "weights float8 channel, activations not quantized",
        ),
        (
            _args(
                num_bits=4,
                type="int",
                strategy="group",
                group_size=32,
                actorder="group",
            ),
            None,
            "activation order",
        ),
    ],
)
def test_unsupported_expert_schemes_are_refused_by_name(weights, inputs, error):
    scheme = {"weights": weights, "input_activations": inputs, "format": None}
    if weights.num_bits == 4 and weights.type == "int":
        scheme["format"] = "pack-quantized"
    layer = SimpleNamespace(moe_config=None)
    with pytest.raises(ValueError, match=f"does not support .*{error}"):
        compressed_tensors_method(HpuCompressedTensorsConfig, layer, scheme)  # type: ignore[arg-type]


class _Float32Experts(moe_methods.HpuQuantizedMoE):
    """Experts 'dequantized' from float32 copies, nothing recorded."""

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor) -> None:
        self.w13, self.w2 = w13, w2

    def dequantize(self, layer, experts, dtype):  # type: ignore[no-untyped-def]
        return self.w13[experts].to(dtype), self.w2[experts].to(dtype)


def test_gathering_the_routed_experts_compiles_once_per_shape():
    """One graph serves a bucket whatever its tokens route to: decodes of one
    token (2 pairs of 8 experts: gathered) with three different routings
    trace once (bf16: the grouped GEMM's shape check wants it), and each
    equals the eager result. (In the engine vLLM's MoE custom op keeps the
    method out of dynamo's graphs; HPU graphs replay it per bucket.)"""
    from torch._dynamo.testing import CompileCounter

    x, w13, w2, weights, ids = _experts()
    method = _Float32Experts(w13, w2)
    layer = _layer()
    counter = CompileCounter()

    def run(x, weights, ids):  # type: ignore[no-untyped-def]
        return method.run_experts(layer, x, weights, ids)

    compiled = torch.compile(run, backend=counter, dynamic=False, fullgraph=True)
    x = x.to(torch.bfloat16)
    for t in range(3):
        args = (x[t : t + 1], weights[t : t + 1], ids[t : t + 1])
        torch.testing.assert_close(compiled(*args), run(*args))
    assert counter.frame_count == 1
