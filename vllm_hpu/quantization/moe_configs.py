"""``fp8``, compressed-tensors and MXFP4 checkpoints: vLLM's configs, except that
their experts get the plugin's methods. vLLM's configs ask its oracle for a
CUDA/ROCm/CPU/XPU MoE backend; an OOT platform gets none ("Unsupported FP8 MoE
backend: NONE") and 0.32 cannot register one. These subclasses, under vLLM's
names, change the experts' method and refuse what we cannot run before load."""

from typing import Any

import torch
from vllm.model_executor.layers.fused_moe import FusedMoEConfig, FusedMoEMethodBase
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (  # noqa: E501
    CompressedTensorsConfig,
)
from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4Config
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    is_layer_skipped,
)

from vllm_hpu.ops.fused_moe import check_supported, refuse
from vllm_hpu.quantization.checkpoints import describe
from vllm_hpu.quantization.fp8 import HpuFp8Config as DenseFp8Config
from vllm_hpu.quantization.fp8_moe import (
    HpuCompressedTensorsW8A8Fp8MoEMethod,
    HpuFp8MoEMethod,
)
from vllm_hpu.quantization.packed_moe import (
    HpuCompressedTensorsMxfp4MoEMethod,
    HpuCompressedTensorsWNA16MoEMethod,
    HpuGptOssMxfp4MoEMethod,
)

PACK_QUANTIZED = "pack-quantized"
PACKED_BITS = (4, 8)
FIX = "use the model's bf16 or another quantized checkpoint"
ACT_DTYPES = [torch.bfloat16, torch.float16, torch.float32]


class HpuFp8Config(DenseFp8Config):
    """``quant_method: fp8`` (per-tensor or block scales): the dense layers as
    quantization/fp8.py runs them, the experts with the plugin's method."""

    def get_quant_method(
        self, layer: torch.nn.Module, prefix: str
    ) -> QuantizeMethodBase | None:
        if not isinstance(layer, RoutedExperts) or is_layer_skipped(
            prefix=prefix,
            ignored_layers=self.ignored_layers,
            fused_mapping=self.packed_modules_mapping,
            match_mode=self.ignored_layers_match_mode,
        ):
            return super().get_quant_method(layer, prefix)
        if self.store_dtype is not None:
            refuse(f"fp8 checkpoints storing experts as {self.store_dtype}", FIX)
        check_supported(layer.moe_config)
        return HpuFp8MoEMethod(self, layer)


class HpuCompressedTensorsConfig(CompressedTensorsConfig):
    """compressed-tensors: W8A8-FP8, WNA16 (``pack-quantized``) and MXFP4A16
    experts; other schemes refused, naming the scheme."""

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return ACT_DTYPES

    def get_quant_method(
        self, layer: torch.nn.Module, prefix: str
    ) -> QuantizeMethodBase | None:
        if not isinstance(layer, RoutedExperts):
            return super().get_quant_method(layer, prefix)
        scheme = expert_scheme(self, layer, prefix)
        if scheme is None:  # ignored: unquantized experts
            return super().get_quant_method(layer, prefix)
        check_supported(layer.moe_config)
        return compressed_tensors_method(self, layer, scheme)


class HpuGptOssMxfp4Config(GptOssMxfp4Config):
    """gpt-oss's own MXFP4 checkpoints: the experts (biases, clamped SwiGLU) with the
    plugin's method; any activation dtype, the experts dequantize to it."""

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return ACT_DTYPES

    def _make_moe_method(self, moe: FusedMoEConfig) -> FusedMoEMethodBase:
        check_supported(moe, with_extras=True)
        return HpuGptOssMxfp4MoEMethod(moe)


def expert_scheme(
    config: CompressedTensorsConfig, layer: RoutedExperts, prefix: str
) -> dict[str, Any] | None:
    """The experts' scheme as vLLM reads it: expert 0's projections'."""
    config._add_fused_moe_to_target_scheme_map()
    names = (layer.ckpt_gate_proj_name, layer.ckpt_up_proj_name)
    schemes = [
        config.get_scheme_dict(layer, f"{prefix}.0.{name}")
        for name in (*names, layer.ckpt_down_proj_name)
    ]
    if any(scheme != schemes[0] for scheme in schemes):
        refuse("experts whose projections have different schemes", FIX)
    return schemes[0]


def compressed_tensors_method(
    config: CompressedTensorsConfig, layer: RoutedExperts, scheme: dict[str, Any]
) -> QuantizeMethodBase:
    weights, inputs = scheme["weights"], scheme.get("input_activations")
    moe = layer.moe_config
    if config._is_mxfp4(weights):
        if inputs is not None:
            refuse(
                f"MXFP4 experts with quantized activations ({describe(scheme)})", FIX
            )
        return HpuCompressedTensorsMxfp4MoEMethod(moe)
    if config._is_wNa16_group_channel(weights, inputs):
        check_packed(scheme)
        return HpuCompressedTensorsWNA16MoEMethod(weights, moe)
    if config._is_fp8_w8a8(weights, inputs):
        return HpuCompressedTensorsW8A8Fp8MoEMethod(weights, inputs, moe)
    refuse(f"compressed-tensors experts of scheme {describe(scheme)}", FIX)


def check_packed(scheme: dict[str, Any]) -> None:
    weights, fmt = scheme["weights"], scheme.get("format")
    if weights.type != "int" or weights.num_bits not in PACKED_BITS:
        refuse(f"compressed-tensors experts of scheme {describe(scheme)}", FIX)
    if fmt != PACK_QUANTIZED:
        refuse(f"compressed-tensors experts in format {fmt!r}", FIX)
    if weights.actorder == "group":
        refuse("compressed-tensors experts with activation order (actorder)", FIX)


def register() -> None:
    register_quantization_config("fp8")(HpuFp8Config)
    register_quantization_config("compressed-tensors")(HpuCompressedTensorsConfig)
    register_quantization_config("gpt_oss_mxfp4")(HpuGptOssMxfp4Config)
