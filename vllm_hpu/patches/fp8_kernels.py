"""fp8 checkpoints on the platform: the block-fp8 linear kernel in vLLM's table,
and per-tensor scales of fused layers kept per shard."""

import functools
from typing import Any

import torch


# a block-fp8 linear kernel for the platform.
# Why: vLLM picks the kernel of a block-scaled fp8 layer (``fp8`` checkpoints with
# ``weight_block_size``, compressed-tensors FP8_BLOCK) from
# ``_POSSIBLE_FP8_BLOCK_KERNELS``, which lists CUDA, ROCm, CPU and XPU kernels only.
# How: vLLM 0.33's ``register_linear_kernel`` takes the kind "fp8_block" (the hook
# that removes this patch); on vLLM 0.32, which lacks it, the kernel becomes the
# table's entry for ``PlatformEnum.OOT`` (compat.register_fp8_block_kernel).
# Upstream change that removes it: vLLM 0.33 (the table entry goes with 0.32).
@functools.cache
def register_block_fp8_kernel() -> None:
    from vllm_hpu.compat import register_fp8_block_kernel
    from vllm_hpu.quantization.fp8 import HpuFp8BlockScaledMMLinearKernel

    register_fp8_block_kernel(HpuFp8BlockScaledMMLinearKernel)


# fp8 per-tensor scales of fused layers.
# Why: a fused layer (q, k and v; gate and up) of a per-tensor fp8 checkpoint loads
# one scale per shard; vLLM then requantizes every shard to the largest scale
# (``w8a8_utils.requantize_with_max_scale``) with its CUDA quantizer
# (``torch.ops._C.static_scaled_fp8_quant``), which is not there without vllm._C,
# and rounds every weight a second time.
# How: on this platform the shards keep their fp8 values and each output row takes
# its shard's scale (vLLM's ``convert_to_channelwise``): a per-channel scale, which
# the HPU fp8 kernel takes; one fused scale stays one scale, as in vLLM.
# Upstream change that removes it: a platform hook for fused per-tensor scales
# (the CPU int8 kernel already converts them to per-channel the same way).
def _shard_scales_per_row(
    weight: torch.Tensor, weight_scale: torch.Tensor, logical_widths: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    from vllm.model_executor.layers.quantization.utils.w8a8_utils import (
        convert_to_channelwise,
    )

    # vLLM's test: unloaded shard scales keep their placeholder, the dtype's min.
    unfused = (
        weight_scale.ndim != 0
        and weight_scale.numel() > 1
        and bool(weight_scale[-1] > torch.finfo(torch.float8_e4m3fn).min)
    )
    if not unfused:
        return weight_scale.max(), weight
    per_row: Any = convert_to_channelwise(weight_scale, logical_widths)
    return per_row, weight


@functools.cache
def keep_fp8_shard_scales() -> None:
    from vllm.model_executor.layers.quantization.utils import w8a8_utils

    w8a8_utils.requantize_with_max_scale = _shard_scales_per_row
