"""4-bit AWQ/GPTQ unpacking and dequantization against naive references, and the
variants refused at start-up."""

import pytest
import torch
from quant_checkpoints import AWQ_ORDER, Scheme, layer_tensors, pack, quantize

from vllm_hpu.ops import int4
from vllm_hpu.ops.awq import HpuAWQConfig, awq_dequantize
from vllm_hpu.ops.gptq import HpuGPTQConfig, gptq_dequantize
from vllm_hpu.platform import HpuPlatform


def naive_unpack(packed: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """Value order[i] of each run of eight sits in bits 4i..4i+3, along dim 1."""
    rows, cols = packed.shape
    out = torch.empty(rows, cols * 8, dtype=torch.int32)
    for r in range(rows):
        for c in range(cols):
            word = int(packed[r, c]) & 0xFFFFFFFF
            for i in range(8):
                out[r, c * 8 + order[i]] = (word >> (4 * i)) & 0xF
    return out


@pytest.mark.parametrize("awq_order", [False, True])
def test_unpack_matches_naive_bit_extraction(awq_order):
    packed = torch.randint(-(2**31), 2**31 - 1, (5, 3), dtype=torch.int32)
    order = AWQ_ORDER if awq_order else tuple(range(8))
    expected = naive_unpack(packed, order)
    torch.testing.assert_close(int4.unpack_int4(packed, 1, awq_order), expected)
    torch.testing.assert_close(
        int4.unpack_int4(packed.t(), 0, awq_order), expected.t().contiguous()
    )


@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
def test_awq_dequantize_matches_reference(group_size):
    scheme = Scheme("awq", group_size)
    q = quantize(torch.randn(48, 256), scheme)
    t = layer_tensors(q, scheme)
    weight = awq_dequantize(t["qweight"], t["qzeros"], t["scales"].float(), group_size)
    torch.testing.assert_close(weight, q.dequantized().t(), rtol=0, atol=0)


@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
@pytest.mark.parametrize(
    ("sym", "desc_act"), [(True, False), (False, False), (False, True)]
)
def test_gptq_dequantize_matches_reference(group_size, sym, desc_act):
    scheme = Scheme("gptq", group_size, sym=sym, desc_act=desc_act)
    q = quantize(torch.randn(48, 256), scheme, seed=3)
    t = layer_tensors(q, scheme)
    config = HpuGPTQConfig(group_size, desc_act, sym, v1=True)
    scales = t["scales"].float()
    weight = gptq_dequantize(t["qweight"], t["qzeros"], scales, t["g_idx"], config)
    torch.testing.assert_close(weight, q.dequantized().t(), rtol=0, atol=0)


def test_gptq_v2_zeros_are_stored_as_they_are():
    scheme = Scheme("gptq", 64)
    q = quantize(torch.randn(16, 128), scheme)
    t = layer_tensors(q, scheme)
    config = HpuGPTQConfig(64, False, False, v1=False)
    zeros = pack(q.zeros, 1)
    weight = gptq_dequantize(t["qweight"], zeros, t["scales"].float(), q.g_idx, config)
    torch.testing.assert_close(weight, q.dequantized().t(), rtol=0, atol=0)


AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}


@pytest.mark.parametrize(
    ("config_cls", "config", "named"),
    [
        (HpuAWQConfig, AWQ | {"bits": 3}, "3-bit"),
        (HpuAWQConfig, AWQ | {"version": "gemv"}, "'gemv'"),
        (HpuAWQConfig, AWQ | {"version": "gemv_fast"}, "'gemv_fast'"),
        (HpuAWQConfig, AWQ | {"zero_point": False}, "zero_point"),
        (HpuGPTQConfig, GPTQ | {"bits": 8}, "8-bit"),
        (HpuGPTQConfig, GPTQ | {"bits": 3}, "3-bit"),
        (HpuGPTQConfig, GPTQ | {"checkpoint_format": "marlin"}, "'marlin'"),
        (HpuGPTQConfig, GPTQ | {"is_marlin_format": True}, "Marlin"),
        (HpuGPTQConfig, GPTQ | {"dynamic": {"-:.*mlp.*": {}}}, "dynamic"),
        (HpuGPTQConfig, GPTQ | {"lm_head": True}, "lm_head"),
    ],
)
def test_unsupported_variants_are_refused_by_name(config_cls, config, named):
    with pytest.raises(ValueError, match=named):
        config_cls.from_config(config)


def test_supported_configs_parse():
    awq = HpuAWQConfig.from_config(AWQ | {"version": "GEMM"})
    assert awq.group_size == 128
    gptq = HpuGPTQConfig.from_config(GPTQ | {"sym": False, "desc_act": True})
    assert (gptq.sym, gptq.desc_act, gptq.v1) == (False, True, True)


def test_platform_accepts_awq_and_gptq_but_not_marlin_formats():
    for method in ("awq", "gptq", "fp8"):
        HpuPlatform.verify_quantization(method)
    with pytest.raises(ValueError, match="gptq_marlin"):
        HpuPlatform.verify_quantization("gptq_marlin")


def test_quantized_experts_are_refused_while_the_model_is_built():
    from vllm.model_executor.layers.fused_moe import RoutedExperts

    experts = RoutedExperts.__new__(RoutedExperts)
    for config in (HpuAWQConfig(128, []), HpuGPTQConfig(128, False, True, True)):
        with pytest.raises(ValueError, match="mixture-of-experts"):
            config.get_quant_method(experts, "model.layers.0.mlp.experts")
