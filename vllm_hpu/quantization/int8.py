"""The int8 W8A8 linear kernel vLLM's compressed-tensors method selects: int8
weights, activations quantized to int8 with a symmetric scale (static or per
token); the int8 values upcast to the activations' dtype (exact in bf16)."""

import functools
from typing import Any

import torch
from vllm.model_executor.kernels.linear import (
    Int8ScaledMMLinearKernel,
    Int8ScaledMMLinearLayerConfig,
    register_linear_kernel,
)
from vllm.model_executor.layers.quantization.utils.w8a8_utils import (
    convert_to_channelwise,
)
from vllm.model_executor.utils import replace_parameter
from vllm.platforms import PlatformEnum

from vllm_hpu.quantization.dequant import scaled_matmul

INT8_MIN, INT8_MAX = -128, 127


def quantize_int8(
    x: torch.Tensor, scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 x, float32 scale) with x ~= q * scale, rounded to nearest even: the
    given (static) scale, or one per row from the row's largest magnitude."""
    if scale is None:
        scale = x.abs().amax(dim=-1, keepdim=True).float() / INT8_MAX
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(x.float() / scale).clamp(INT8_MIN, INT8_MAX).to(torch.int8)
    return q, scale


class HpuInt8ScaledMMLinearKernel(Int8ScaledMMLinearKernel):
    """Symmetric int8 activations only (asymmetric refused: checkpoints.py)."""

    @classmethod
    def is_supported(
        cls, compute_capability: int | None = None
    ) -> tuple[bool, str | None]:
        return True, None

    @classmethod
    def can_implement(cls, c: Int8ScaledMMLinearLayerConfig) -> tuple[bool, str | None]:
        if not c.input_symmetric:
            return False, "asymmetric int8 activations are not supported"
        return True, None

    def process_weights_after_loading(self, layer: Any) -> None:
        """Weight to [K, N]; the per-tensor scales of a fused layer's shards to
        one per output channel; a static input scale to one for the layer."""
        w_q, w_s, i_s, _, _ = self.layer_param_names
        replace_parameter(layer, w_q, getattr(layer, w_q).t().data)
        scale = getattr(layer, w_s)
        if not self.config.is_channelwise:
            scale = convert_to_channelwise(scale, layer.logical_widths)
        replace_parameter(layer, w_s, scale.data)
        if self.config.is_static_input_scheme:
            replace_parameter(layer, i_s, getattr(layer, i_s).max())

    def apply_weights(
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        weight, weight_scale, input_scale, _, _ = self._get_layer_params(layer)
        x_2d = x.reshape(-1, x.shape[-1])
        x_q, x_scale = quantize_int8(x_2d, input_scale)
        out = scaled_matmul(x_q, weight, x_scale, weight_scale, x.dtype, bias)
        return out.view(*x.shape[:-1], weight.shape[1])


@functools.cache
def register() -> None:
    kernel: Any = HpuInt8ScaledMMLinearKernel
    register_linear_kernel(kernel, PlatformEnum.OOT, "int8")
