"""The MXFP4 linear kernel for compressed-tensors ``mxfp4-pack-quantized`` (W4A16):
e2m1 codes, two per byte, one power-of-two scale per 32 inputs, dequantized in
the forward. W4A4 is refused at start-up (``quantization/checkpoints.py``)."""

import functools
from typing import Any

import torch
from vllm.model_executor.kernels.linear import (
    MxFp4LinearKernel,
    MxFp4LinearLayerConfig,
    register_linear_kernel,
)
from vllm.platforms import PlatformEnum

from vllm_hpu.quantization.dequant import dequantize_mxfp4


class HpuMxfp4LinearKernel(MxFp4LinearKernel):
    """y = x @ dequant(weight).T; weight [N, K / 2] uint8, scale [N, K / 32] e8m0."""

    @classmethod
    def is_supported(
        cls, compute_capability: int | None = None
    ) -> tuple[bool, str | None]:
        return True, None

    @classmethod
    def can_implement(cls, config: MxFp4LinearLayerConfig) -> tuple[bool, str | None]:
        return True, None

    def process_weights_after_loading(self, layer: Any) -> None:
        layer.weight_scale = torch.nn.Parameter(
            layer.weight_scale.data, requires_grad=False
        )

    def apply_weights(
        self,
        layer: Any,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        weight = dequantize_mxfp4(layer.weight, layer.weight_scale, x.dtype)
        out = torch.matmul(x, weight.t())
        return out if bias is None else out + bias


@functools.cache
def register() -> None:
    kernel: Any = HpuMxfp4LinearKernel
    register_linear_kernel(kernel, PlatformEnum.OOT, "mxfp4")
