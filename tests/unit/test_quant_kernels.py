"""The linear kernels the plugin registers for quantized checkpoints, on one
layer, against float64 references that dequantize the weights and quantize the
activations the way the checkpoint asks; each activation-quantized kernel also
differs from the same weights with float activations (it did quantize them)."""

import math

import pytest
import torch
from quant_checkpoints import (
    dequantize_fp8_reference,
    fp8_groups,
    fp8_per_tensor_dynamic,
    fp8_per_token,
    fp8_static,
    int8_per_token,
    pack,
    quantize_fp8,
    quantize_mxfp4,
)
from vllm.config import (
    CompilationConfig,
    CompilationMode,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.model_executor.kernels.linear import (
    FP8ScaledMMLinearLayerConfig,
    Int8ScaledMMLinearLayerConfig,
    MPLinearLayerConfig,
    MxFp4LinearLayerConfig,
)
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    GroupShape,
    create_fp8_quant_key,
    kFp8DynamicTensorSym,
    kFp8DynamicTokenSym,
    kFp8StaticChannelSym,
    kFp8StaticTensorSym,
)
from vllm.scalar_type import scalar_types

from vllm_hpu.patches import fp8_kernels
from vllm_hpu.quantization.dequant import dequantize_mxfp4
from vllm_hpu.quantization.fp8 import (
    HpuFp8BlockScaledMMLinearKernel,
    HpuFp8ScaledMMLinearKernel,
)
from vllm_hpu.quantization.int8 import HpuInt8ScaledMMLinearKernel
from vllm_hpu.quantization.mxfp4 import HpuMxfp4LinearKernel
from vllm_hpu.quantization.wna16 import HpuWNA16LinearKernel


@pytest.fixture(autouse=True)
def vllm_config():  # type: ignore[no-untyped-def]
    """vLLM's activation quantizer is a custom op: built under a config, run
    through forward_oot as the platform's config check sets it."""
    compilation = CompilationConfig(mode=CompilationMode.NONE, custom_ops=["all"])
    with set_current_vllm_config(VllmConfig(compilation_config=compilation)) as c:
        yield c


FP8_PARAMS = ["weight", "weight_scale", "input_scale", "input_scale_ub"]
INT8_PARAMS = ["weight", "weight_scale", "input_scale", "input_zero_point", "azp_adj"]


def layer(**tensors: torch.Tensor | None) -> torch.nn.Module:
    module = torch.nn.Module()
    for name, tensor in tensors.items():
        if tensor is None:
            setattr(module, name, None)
        else:
            module.register_parameter(name, torch.nn.Parameter(tensor, False))
    return module


def fp8_config(act_key, weight_key, shape) -> FP8ScaledMMLinearLayerConfig:
    return FP8ScaledMMLinearLayerConfig(
        weight_quant_key=weight_key,
        activation_quant_key=act_key,
        weight_shape=shape,
        input_dtype=torch.float32,
        out_dtype=torch.float32,
    )


def assert_quantized_linear(out, x_ref, w_ref, bias, x):
    """``out`` matches the reference on quantized activations, not on float ones."""
    expected = x_ref.double() @ w_ref.double().t() + bias.double()
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-4)
    unquantized = x.double() @ w_ref.double().t() + bias.double()
    assert (out.double() - unquantized).abs().max() > 1e-3


@pytest.mark.parametrize(
    ("act_key", "weight_key"),
    [
        (kFp8DynamicTokenSym, kFp8StaticChannelSym),  # compressed-tensors dynamic
        (kFp8DynamicTensorSym, kFp8StaticTensorSym),  # fp8 dynamic: per token here
        (kFp8StaticTensorSym, kFp8StaticTensorSym),
    ],
    ids=["dynamic-channel", "dynamic-tensor", "static-tensor"],
)
def test_fp8_scaled_mm_kernel(act_key, weight_key):
    n, k = 48, 64
    x, w, bias = torch.randn(5, k) * 3, torch.randn(n, k), torch.randn(n)
    per_channel = weight_key == kFp8StaticChannelSym
    wq, w_scale = quantize_fp8(w, (1, k) if per_channel else None)  # [n, 1] or []
    x_scale = torch.tensor([0.02]) if act_key.scale.static else None
    kernel = HpuFp8ScaledMMLinearKernel(
        fp8_config(act_key, weight_key, (n, k)), FP8_PARAMS
    )
    module = layer(weight=wq.t(), weight_scale=w_scale, input_scale=x_scale)
    out = kernel.apply_weights(module, x, bias)
    x_ref = fp8_static(x, x_scale) if act_key.scale.static else fp8_per_token(x, None)
    w_ref = wq.float() * w_scale.reshape(-1, 1)
    assert_quantized_linear(out, x_ref, w_ref, bias, x)
    if act_key == kFp8DynamicTensorSym:  # declared per tensor, refined per token
        declared = fp8_per_tensor_dynamic(x, None).double() @ w_ref.double().t()
        error = (out.double() - declared - bias.double()).norm() / declared.norm()
        assert error < DECLARED_ERROR


# The output's relative distance (norm) to the same linear on inputs quantized per
# tensor, as a dynamic per-tensor checkpoint declares them: the kernel quantizes
# per token, so the two differ by fp8's rounding (e4m3: 3 mantissa bits; 3 % on
# average, at most 4 % over 20 random draws).
DECLARED_ERROR = 0.08


@pytest.mark.parametrize("shape", [(256, 256), (200, 300)])
def test_block_fp8_kernel_with_partial_edge_blocks(shape):
    n, k = shape
    x, w, bias = torch.randn(3, k), torch.randn(n, k), torch.randn(n)
    wq, scale_inv = quantize_fp8(w, (128, 128))
    config = fp8_config(
        create_fp8_quant_key(static=False, group_shape=GroupShape(1, 128)),
        create_fp8_quant_key(static=True, group_shape=GroupShape(128, 128)),
        shape,
    )
    kernel = HpuFp8BlockScaledMMLinearKernel(config)
    out = kernel.apply_weights(layer(weight=wq, weight_scale_inv=scale_inv), x, bias)
    padded = torch.nn.functional.pad(x, (0, -k % 128))
    x_ref = fp8_groups(128)(padded, None)[:, :k]
    w_ref = dequantize_fp8_reference(wq, scale_inv, (128, 128))
    assert_quantized_linear(out, x_ref, w_ref, bias, x)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("channelwise", [False, True])
def test_int8_kernel(static, channelwise):
    widths = [32, 16]  # a fused layer: per-tensor scales come one per shard
    n, k = sum(widths), 64
    x, bias = torch.randn(4, k), torch.randn(n)
    wq = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    w_scale = torch.rand(n, 1) * 0.01 if channelwise else torch.rand(2) * 0.01
    rows = w_scale if channelwise else w_scale.repeat_interleave(torch.tensor(widths))
    config = Int8ScaledMMLinearLayerConfig(
        is_static_input_scheme=static, is_channelwise=channelwise, input_symmetric=True
    )
    kernel = HpuInt8ScaledMMLinearKernel(config, INT8_PARAMS)
    x_scale = torch.tensor([0.03, 0.02]) if static else None
    module = layer(weight=wq, weight_scale=w_scale, input_scale=x_scale)
    module.logical_widths = widths
    kernel.process_weights_after_loading(module)
    out = kernel.apply_weights(module, x, bias)
    if static:
        x_ref = (torch.round(x / 0.03).clamp(-128, 127)) * 0.03  # the larger scale
    else:
        x_ref = int8_per_token(x, None)
    assert_quantized_linear(out, x_ref, wq.float() * rows.reshape(-1, 1), bias, x)


@pytest.mark.parametrize(
    ("bits", "group_size", "zero_points"),
    [(4, 32, False), (4, 64, True), (8, -1, False), (8, 16, True)],
)
def test_wna16_kernel(bits, group_size, zero_points):
    n, k = 24, 128
    lo, hi = 0, (1 << bits) - 1
    values = torch.randint(lo, hi + 1, (n, k))
    groups = 1 if group_size == -1 else k // group_size
    scales = torch.rand(n, groups) * 0.1
    zeros = torch.randint(lo, hi + 1, (n, groups)) if zero_points else None
    weight_type = {
        (4, False): scalar_types.uint4b8,
        (4, True): scalar_types.uint4,
        (8, False): scalar_types.uint8b128,
        (8, True): scalar_types.uint8,
    }[bits, zero_points]
    config = MPLinearLayerConfig(
        (k, n), (k, n), weight_type, torch.float32, group_size, zero_points
    )
    kernel = HpuWNA16LinearKernel(
        config, "weight_packed", "weight_scale", "weight_zero_point"
    )
    module = layer(
        weight_packed=pack(values, 1, bits=bits),
        weight_scale=scales,
        weight_zero_point=None if zeros is None else pack(zeros, 0, bits=bits),
    )
    kernel.process_weights_after_loading(module)
    x, bias = torch.randn(3, k), torch.randn(n)
    zero = (
        zeros if zero_points else torch.full_like(values, 1 << (bits - 1))[:, :groups]
    )
    g = torch.arange(k) // (k // groups)
    w_ref = (values - zero[:, g]).double() * scales[:, g].double()
    expected = x.double() @ w_ref.t() + bias.double()
    out = kernel.apply_weights(module, x, bias)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-4)


def test_mxfp4_kernel_is_weight_only():
    n, k = 16, 96
    w, x, bias = torch.randn(n, k), torch.randn(3, k), torch.randn(n)
    packed, scales = quantize_mxfp4(w)
    kernel = HpuMxfp4LinearKernel(MxFp4LinearLayerConfig())
    module = layer(weight=packed, weight_scale=scales)
    kernel.process_weights_after_loading(module)
    out = kernel.apply_weights(module, x, bias)
    w_ref = dequantize_mxfp4(packed, scales)
    # The test quantizer's rounding: within half a step of e2m1's widest gap.
    assert (w_ref - w).abs().max() <= 2.0 ** math.ceil(math.log2(w.abs().max())) / 4
    expected = x.double() @ w_ref.double().t() + bias.double()
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-4)


def test_fused_per_tensor_fp8_scales_become_per_row_without_requantizing():
    weight = (torch.randn(6, 8) * 100).to(torch.float8_e4m3fn)
    shard_scales = torch.tensor([0.5, 2.0])
    scale, kept = fp8_kernels._shard_scales_per_row(weight, shard_scales, [4, 2])
    assert kept is weight
    torch.testing.assert_close(scale.flatten(), torch.tensor([0.5] * 4 + [2.0] * 2))
    one_fused = torch.tensor([0.25, torch.finfo(torch.float32).min])  # one loaded
    assert fp8_kernels._shard_scales_per_row(weight, one_fused, [4, 2])[0] == 0.25


def test_kernels_are_registered_for_the_platform():
    from vllm.model_executor.kernels import linear
    from vllm.platforms import PlatformEnum

    from vllm_hpu import register_ops

    register_ops()
    oot = PlatformEnum.OOT
    tables = {
        HpuFp8ScaledMMLinearKernel: linear._POSSIBLE_FP8_KERNELS,
        HpuFp8BlockScaledMMLinearKernel: linear._POSSIBLE_FP8_BLOCK_KERNELS,
        HpuInt8ScaledMMLinearKernel: linear._POSSIBLE_INT8_KERNELS,
        HpuWNA16LinearKernel: linear._POSSIBLE_KERNELS,
        HpuMxfp4LinearKernel: linear._POSSIBLE_MXFP4_KERNELS,
    }
    for kernel, table in tables.items():
        assert table[oot].count(kernel) == 1, kernel
