"""vLLM's online per-tensor FP8 (``--quantization fp8``) on HPU: weights cast to
fp8 at load with one scale each, activations cast per step, upcast matmul."""

from typing import Any

import torch
from vllm.model_executor.layers.quantization.online import base as online_base
from vllm.model_executor.layers.quantization.online.fp8 import OnlineLinearBase
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    kFp8StaticTensorSym,
)
from vllm.model_executor.utils import replace_parameter

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max
_MIN_SCALE = 1e-12  # an all-zero tensor still gets a usable scale


def quantize_per_tensor(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 tensor, float32 scale) with t ~= fp8 * scale, its largest magnitude
    mapped to fp8's largest value."""
    scale = (t.abs().amax().float() / FP8_MAX).clamp(min=_MIN_SCALE)
    q = (t.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x @ weight.T of an fp8 (out, in) weight, x cast to fp8 per tensor as an fp8
    gemm would take it; the fp8 values are exact in x's dtype, so the matmul runs
    upcast and the two scales multiply its result."""
    xq, x_scale = quantize_per_tensor(x)
    out = torch.matmul(xq.to(x.dtype), weight.to(x.dtype).t())
    out = out * (x_scale * weight_scale).to(x.dtype)
    return out if bias is None else out + bias


class HpuFp8PerTensorOnlineLinearMethod(OnlineLinearBase):
    """vLLM's online per-tensor FP8 linear method without its CUDA kernels: the
    bf16 weight vLLM loads is cast to fp8 once, in process_weights_after_loading."""

    def process_weights_after_loading(self, layer: Any) -> None:
        if getattr(layer, "_already_called_process_weights_after_loading", False):
            return
        weight, scale = quantize_per_tensor(self.get_weight_for_quantization(layer))
        self.release_requantization_source_weights(layer)
        replace_parameter(layer, "weight", weight)
        layer.register_parameter(
            "weight_scale", torch.nn.Parameter(scale, requires_grad=False)
        )
        layer.input_scale = None
        layer._already_called_process_weights_after_loading = True

    def apply(
        self,
        layer: Any,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return fp8_linear(x, layer.weight, layer.weight_scale, bias)


def register() -> None:
    """vLLM builds its online config itself and looks its linear methods up in a
    module-level table, with no registration hook: the per-tensor entry is ours."""
    methods: dict[Any, type] = online_base._ONLINE_LINEAR_METHODS
    methods[kFp8StaticTensorSym] = HpuFp8PerTensorOnlineLinearMethod
