"""fp8 on the platform: the block-fp8 linear kernel in vLLM's table, per-tensor
scales of fused layers kept per shard, and vLLM's activation quantizer within
the card's fp8 range."""

import functools
from typing import Any

import torch


# a block-fp8 linear kernel for the platform.
# Why: vLLM picks block-scaled fp8 kernels from ``_POSSIBLE_FP8_BLOCK_KERNELS``
# (CUDA, ROCm, CPU and XPU only).
# How: on vLLM 0.32 the kernel becomes the table's ``PlatformEnum.OOT`` entry
# (compat.register_fp8_block_kernel).
# Upstream change that removes it: vLLM 0.33's ``register_linear_kernel``
# with kind "fp8_block".
@functools.cache
def register_block_fp8_kernel() -> None:
    from vllm_hpu.compat import register_fp8_block_kernel
    from vllm_hpu.quantization.fp8 import HpuFp8BlockScaledMMLinearKernel

    register_fp8_block_kernel(HpuFp8BlockScaledMMLinearKernel)


# fp8 per-tensor scales of fused layers.
# Why: a fused layer (qkv; gate/up) loads one scale per shard; vLLM requantizes
# every shard to the largest (``requantize_with_max_scale``) with vllm._C's CUDA
# quantizer, absent here, rounding every weight twice.
# How: shards keep their fp8 values, each output row its shard's scale (vLLM's
# ``convert_to_channelwise``); one fused scale stays one scale.
# Upstream change that removes it: a platform hook for fused per-tensor scales
# (the CPU int8 kernel already converts them likewise).
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


# vLLM's activation quantizer within the card's e4m3 range.
# Why: ``QuantFP8`` quantizes to module bounds from ``finfo(float8_e4m3fn)``,
# 448; Gaudi2's e4m3 stops at 240 and reads values past it as NaN (vllm-gaudi's
# FP8_MAX is 240 there).
# How: on such a card the module's bounds and smallest scale become the card's.
# Upstream change that removes it: a platform hook for the fp8 range (vLLM asks
# ``is_fp8_fnuz`` only, whose dtype Gaudi does not use).
@functools.cache
def quantize_within_card_range() -> None:
    from vllm.model_executor.layers.quantization import input_quant_fp8

    from vllm_hpu import device

    limit = device.fp8_max()
    if limit >= input_quant_fp8._FP8_MAX:
        return
    input_quant_fp8._FP8_MIN, input_quant_fp8._FP8_MAX = -limit, limit
    input_quant_fp8._FP8_MIN_SCALING_FACTOR = 1.0 / (limit * 512.0)
