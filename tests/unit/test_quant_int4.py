"""The AWQ/GPTQ configs: the variants refused at start-up, the ones parsed
(their dequantization is tested in test_dequant.py)."""

import pytest

from vllm_hpu.platform import HpuPlatform
from vllm_hpu.quantization.awq import HpuAWQConfig
from vllm_hpu.quantization.gptq import HpuGPTQConfig

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


def test_act_order_experts_are_refused_while_the_model_is_built():
    """GPTQ experts with desc_act have a g_idx per projection that vLLM's expert
    loader cannot place: refused by name (others: tests/e2e/test_quantized_moe)."""
    from vllm.model_executor.layers.fused_moe import RoutedExperts

    experts = RoutedExperts.__new__(RoutedExperts)
    config = HpuGPTQConfig(128, desc_act=True, sym=True, v1=True)
    with pytest.raises(ValueError, match="GPTQ experts with desc_act"):
        config.get_quant_method(experts, "model.layers.0.mlp.experts")
