"""FP8 experts of ``fp8`` checkpoints (per-tensor, or DeepSeek's block
``weight_scale_inv``) and compressed-tensors W8A8-FP8 (per tensor, channel or
block), as vLLM's methods load them. Block-scaled experts run dequantized on
unquantized activations (the Gaudi reference's path). Per-tensor and
per-channel ones take fp8 activations (static scale, or per tensor; per token
for compressed-tensors' dynamic tokens). Per-tensor ones run Gaudi's fp8 MoE
kernel, which also rounds the intermediate through fp8 (static or per token);
emulation rounds alike around dequantized experts. Per-token inputs keep the
intermediate in the model dtype."""

from dataclasses import replace
from typing import Any

import torch
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w8a8_fp8 import (  # noqa: E501
    CompressedTensorsW8A8Fp8MoEMethod,
)
from vllm.model_executor.layers.quantization.fp8 import Fp8MoEMethod

from vllm_hpu import device
from vllm_hpu.ops.fused_moe import ExpertGroup
from vllm_hpu.ops.moe import ExpertExtras
from vllm_hpu.quantization.dequant import dequantize_fp8
from vllm_hpu.quantization.fp8 import FP8_DTYPE, FP8_MAX, fit_card_range
from vllm_hpu.quantization.moe_methods import HpuQuantizedMoE

_MIN_SCALE = 1e-12  # an all-zero input still gets a usable scale
# How the experts' input is rounded through fp8: with the checkpoint's scale, or
# with one computed per tensor or per token; None: not at all (block scales).
STATIC, PER_TENSOR, PER_TOKEN = "static", "tensor", "token"


def quantize_input(
    x: torch.Tensor, mode: str, static_scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 x, its scale): one scale, or [num_tokens, 1] per token."""
    if mode == STATIC and static_scale is not None:
        scale = static_scale
    elif mode == PER_TENSOR:
        scale = x.abs().amax().float() / FP8_MAX
    else:
        scale = x.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX
    scale = scale.clamp(min=_MIN_SCALE)
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def round_through_fp8(
    x: torch.Tensor, mode: str, static_scale: torch.Tensor | None
) -> torch.Tensor:
    """``x`` as fp8 with its scale holds it, back in x's dtype."""
    xq, scale = quantize_input(x, mode, static_scale)
    return (xq.float() * scale).to(x.dtype)


def dequantize_w13_blocks(
    weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int], dtype: Any
) -> torch.Tensor:
    """w13's gate and up halves each have their own rows of blocks (the last
    partial when the intermediate size is not a multiple of the block)."""
    halves = zip(weight.chunk(2, dim=-2), scale.chunk(2, dim=-2), strict=True)
    return torch.cat([dequantize_fp8(w, s, block, dtype) for w, s in halves], -2)


class HpuFp8Experts(HpuQuantizedMoE):
    """Both fp8 formats once loaded: ``w13_weight``/``w2_weight`` fp8 [E, N, K];
    scales per row [E, N, 1] (per-tensor spread over shards) or block; input mode."""

    block: tuple[int, int] | None
    input_mode: str | None

    def scales(self, layer: Any) -> tuple[torch.Tensor, torch.Tensor]:
        suffix = "weight_scale_inv" if hasattr(layer, "w13_weight_scale_inv") else ""
        name = suffix or "weight_scale"
        return getattr(layer, f"w13_{name}"), getattr(layer, f"w2_{name}")

    def process_weights_after_loading(self, layer: Any) -> None:
        w13_scale, w2_scale = self.scales(layer)
        if self.block is None and w13_scale.ndim == 2:  # one scale per shard
            rows = layer.intermediate_size_per_partition
            w13_scale.data = w13_scale.data.repeat_interleave(rows, dim=1)[..., None]
            w2_scale.data = w2_scale.data.reshape(-1, 1, 1)
        static = getattr(layer, "w13_input_scale", None)
        if self.input_mode == STATIC and static is not None:
            # One scale for the input of all experts, as vLLM's kernels take it.
            static.data = static.data.max()
        static_w2 = getattr(layer, "w2_input_scale", None)
        if self.input_mode == STATIC and static_w2 is not None:
            static_w2.data = static_w2.data.max()
        fit_card_range(layer.w13_weight, w13_scale, static)
        fit_card_range(layer.w2_weight, w2_scale, static_w2)

    def dequantize(
        self, layer: Any, experts: slice | torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        w13_scale, w2_scale = self.scales(layer)
        w13, w2 = layer.w13_weight[experts], layer.w2_weight[experts]
        if self.block is not None:
            w13 = dequantize_w13_blocks(w13, w13_scale[experts], self.block, dtype)
            return w13, dequantize_fp8(w2, w2_scale[experts], self.block, dtype)
        return (
            dequantize_fp8(w13, w13_scale[experts], dtype=dtype),
            dequantize_fp8(w2, w2_scale[experts], dtype=dtype),
        )

    def prepare_input(self, layer: Any, x: torch.Tensor) -> torch.Tensor:
        if self.input_mode is None or self._kernel() is not None:
            return x
        return round_through_fp8(x, self.input_mode, layer.w13_input_scale)

    def extras(self, layer: Any) -> ExpertExtras:
        """Per-tensor experts round the intermediate through fp8 as the kernel does:
        with the down projection's checkpoint input scale (as vLLM's), or per token."""
        extras = super().extras(layer)
        if self.input_mode not in (STATIC, PER_TENSOR):
            return extras
        mode = STATIC if self.input_mode == STATIC else PER_TOKEN
        scale = getattr(layer, "w2_input_scale", None)
        return replace(extras, intermediate=lambda h: round_through_fp8(h, mode, scale))

    def _kernel(self) -> Any:
        """Gaudi's fp8 MoE kernel where it takes this input (one static scale,
        or one computed per tensor: its dynamic overload), else None."""
        if self.input_mode not in (STATIC, PER_TENSOR):
            return None
        return device.fused_moe_fp8(dynamic=self.input_mode == PER_TENSOR)

    def run_group(
        self, layer: Any, x: torch.Tensor, group: ExpertGroup, extras: ExpertExtras
    ) -> torch.Tensor:
        kernel, mode = self._kernel(), self.input_mode
        if kernel is None or mode is None:
            return super().run_group(layer, x, group, extras)
        xq, x_scale = quantize_input(x, mode, layer.w13_input_scale)
        w13_scale, w2_scale = self.scales(layer)
        experts = group.experts
        w13, w2 = layer.w13_weight[experts], layer.w2_weight[experts]
        scales = {}
        if mode == STATIC:  # the down projection's input scale, for each expert
            intermediate = [layer.w2_input_scale] * w13.shape[0]
            scales["d_scale_intermediate_hidden_states"] = intermediate
        out = kernel(
            hidden_states=xq,
            expert_routing_table=group.topk_ids.long(),
            router_weights=group.topk_weights.to(x.dtype),
            w12=list(w13.unbind(0)),
            w3=list(w2.unbind(0)),
            d_scale_hidden_states=x_scale,
            d_scale_w12=list(w13_scale[experts].flatten(1).unbind(0)),
            d_scale_w3=list(w2_scale[experts].flatten(1).unbind(0)),
            permuted_weights=True,
            activation=layer.activation.value,
            experts_min=group.first,
            experts_max=group.first + w13.shape[0] - 1,
            **scales,
        )
        return out.to(x.dtype)


class HpuFp8MoEMethod(HpuFp8Experts, Fp8MoEMethod):
    """``quant_method: fp8`` experts (vLLM's ``Fp8MoEMethod`` loads them; its
    backend choice finds none for an out-of-tree platform, and is not used)."""

    def __init__(self, quant_config: Any, layer: Any) -> None:
        super().__init__(quant_config, layer)
        block = quant_config.weight_block_size
        self.block = None if block is None else (block[0], block[1])
        static = quant_config.activation_scheme == "static"
        self.input_mode = None if self.block else STATIC if static else PER_TENSOR


class HpuCompressedTensorsW8A8Fp8MoEMethod(
    HpuFp8Experts, CompressedTensorsW8A8Fp8MoEMethod
):
    """compressed-tensors W8A8-FP8 experts (vLLM's method loads them)."""

    def __init__(self, weight_quant: Any, input_quant: Any, moe: Any) -> None:
        super().__init__(weight_quant, input_quant, moe)
        block = self.weight_block_size
        self.block = None if block is None else (block[0], block[1])
        self.input_mode = None
        if self.block is None:
            dynamic = PER_TOKEN if input_quant.strategy == "token" else PER_TENSOR
            self.input_mode = STATIC if self.static_input_scales else dynamic
