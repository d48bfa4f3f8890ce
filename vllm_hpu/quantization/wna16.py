"""The weight-only integer linear kernel vLLM's compressed-tensors WNA16 method
selects (``pack-quantized`` W4A16 / W8A16: group or channel scales, symmetric or
with zero points): the packed int32 words stay in device memory and are
dequantized in plain torch inside the forward."""

import functools
from typing import Any

import torch
from vllm.model_executor.kernels.linear import (
    MPLinearKernel,
    MPLinearLayerConfig,
    register_linear_kernel,
)
from vllm.platforms import PlatformEnum
from vllm.scalar_type import scalar_types

from vllm_hpu.quantization.dequant import dequantize_pack_quantized, pack_factor

# uint4b8 / uint8b128: symmetric values stored with a bias of half their range.
SUPPORTED_WEIGHT_TYPES = (
    scalar_types.uint4b8,
    scalar_types.uint8b128,
    scalar_types.uint4,
    scalar_types.uint8,
)


class HpuWNA16LinearKernel(MPLinearKernel):
    """y = x @ dequant(weight_packed).T; weight_packed [N, K / pack] packed along
    the input, weight_scale [N, groups], weight_zero_point [N / pack, groups]."""

    @classmethod
    def get_min_capability(cls) -> int:
        return 0

    @classmethod
    def can_implement(cls, c: MPLinearLayerConfig) -> tuple[bool, str | None]:
        if c.weight_type not in SUPPORTED_WEIGHT_TYPES:
            return False, f"weight type {c.weight_type} is not 4- or 8-bit"
        rows = c.partition_weight_shape[0]
        if rows % pack_factor(c.weight_type.size_bits):
            return False, f"{rows} inputs do not fill whole int32 words"
        if c.group_size not in (-1, 0) and rows % c.group_size:
            return False, f"{rows} inputs do not split into groups of {c.group_size}"
        return True, None

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        for name in (self.w_q_name, self.w_s_name, self.w_zp_name):
            self._transform_param(layer, name, lambda param: param)

    def apply_weights(
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        packed, scales, zeros = self._get_weight_params(layer)
        bits = self.config.weight_type.size_bits
        zeros = zeros if self.config.zero_points else None
        weight = dequantize_pack_quantized(packed, scales, bits, zeros)
        out = torch.matmul(x, weight.to(x.dtype).t())
        return out if bias is None else out + bias


@functools.cache
def register() -> None:
    kernel: Any = HpuWNA16LinearKernel
    register_linear_kernel(kernel, PlatformEnum.OOT, "mp")
