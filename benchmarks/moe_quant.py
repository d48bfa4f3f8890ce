"""Quantized experts' dequantize-and-multiply against bf16 experts: each format's
MoE method (its ``run_experts``: dequantize the experts, then ops/moe.py's
token-to-expert path) on the Mixtral-like layer of benchmarks/ops.py, with random
codes and scales. Run through ``python benchmarks/ops.py --op quant-moe``."""

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from vllm_hpu.ops.moe import MoeRouting, fused_experts, select_experts
from vllm_hpu.quantization.fp8_moe import (
    PER_TOKEN,
    HpuCompressedTensorsW8A8Fp8MoEMethod,
    HpuFp8MoEMethod,
)
from vllm_hpu.quantization.packed_moe import (
    HpuAWQMoEMethod,
    HpuCompressedTensorsMxfp4MoEMethod,
    HpuCompressedTensorsWNA16MoEMethod,
    HpuGPTQMoEMethod,
)

GROUP_SIZE, BLOCK = 128, (128, 128)
WORD = (-(2**31), 2**31 - 1)  # random int32 words: eight random 4-bit codes
SCALE, E8M0_SCALE = 1e-3, 117  # 2 ** (117 - 127) ~ 1e-3


def _method(cls: type, **fields: Any) -> Any:
    """A method as its config would build it, with only the fields the forward
    reads (its vLLM constructor wants a whole engine's configuration)."""
    method = cls.__new__(cls)
    method.__dict__.update(fields)
    return method


def _words(*shape: int) -> torch.Tensor:
    return torch.randint(*WORD, shape, dtype=torch.int32)


def _full(dtype: torch.dtype, *shape: int) -> torch.Tensor:
    return torch.full(shape, SCALE, dtype=dtype)


def _codes(*shape: int) -> torch.Tensor:
    return torch.randint(0, 256, shape, dtype=torch.uint8)


def _e8m0(*shape: int) -> torch.Tensor:
    return torch.full(shape, E8M0_SCALE, dtype=torch.uint8)


def quantized_layers(e: int, h: int, i: int, dtype: torch.dtype) -> dict[str, tuple]:
    """(method, layer) per format: E experts, hidden h, intermediate i."""
    n13, fp8 = 2 * i, torch.float8_e4m3fn
    fp8_w = {
        "w13_weight": torch.randn(e, n13, h).to(fp8),
        "w2_weight": torch.randn(e, h, i).to(fp8),
    }
    groups = SimpleNamespace(group_size=GROUP_SIZE, sym=True, v1=True)
    scale = SCALE
    return {
        "fp8 block 128x128": (
            _method(HpuFp8MoEMethod, block=BLOCK, input_mode=None),
            fp8_w
            | {
                "w13_weight_scale_inv": torch.full((e, n13 // 128, h // 128), scale),
                "w2_weight_scale_inv": torch.full((e, h // 128, i // 128), scale),
            },
        ),
        "fp8 channel, fp8 tokens": (
            _method(
                HpuCompressedTensorsW8A8Fp8MoEMethod, block=None, input_mode=PER_TOKEN
            ),
            fp8_w
            | {
                "w13_weight_scale": torch.full((e, n13, 1), scale),
                "w2_weight_scale": torch.full((e, h, 1), scale),
                "w13_input_scale": None,
            },
        ),
        "WNA16 int4 g128 (compressed-tensors)": (
            _method(HpuCompressedTensorsWNA16MoEMethod, num_bits=4),
            {
                "w13_weight_packed": _words(e, n13, h // 8),
                "w2_weight_packed": _words(e, h, i // 8),
                "w13_weight_scale": _full(dtype, e, n13, h // GROUP_SIZE),
                "w2_weight_scale": _full(dtype, e, h, i // GROUP_SIZE),
            },
        ),
        "AWQ int4 g128": (
            _method(HpuAWQMoEMethod, quant_config=groups),
            {
                "w13_qweight": _words(e, h, n13 // 8),
                "w2_qweight": _words(e, i, h // 8),
                "w13_qzeros": _words(e, h // GROUP_SIZE, n13 // 8),
                "w2_qzeros": _words(e, i // GROUP_SIZE, h // 8),
                "w13_scales": _full(dtype, e, h // GROUP_SIZE, n13),
                "w2_scales": _full(dtype, e, i // GROUP_SIZE, h),
            },
        ),
        "GPTQ int4 g128 (symmetric)": (
            _method(HpuGPTQMoEMethod, quant_config=groups),
            {
                "w13_qweight": _words(e, h // 8, n13),
                "w2_qweight": _words(e, i // 8, h),
                "w13_qzeros": _words(e, h // GROUP_SIZE, n13 // 8),
                "w2_qzeros": _words(e, i // GROUP_SIZE, h // 8),
                "w13_scales": _full(dtype, e, h // GROUP_SIZE, n13),
                "w2_scales": _full(dtype, e, i // GROUP_SIZE, h),
            },
        ),
        "MXFP4-A16": (
            _method(HpuCompressedTensorsMxfp4MoEMethod),
            {
                "w13_weight_packed": _codes(e, n13, h // 2),
                "w2_weight_packed": _codes(e, h, i // 2),
                "w13_weight_scale": _e8m0(e, n13, h // 32),
                "w2_weight_scale": _e8m0(e, h, i // 32),
            },
        ),
    }


def quantized_moe_calls(
    x: torch.Tensor, logits: torch.Tensor, top_k: int, intermediate: int
) -> dict[str, Callable[[], torch.Tensor]]:
    """Each format's routed experts on ``x``, and bf16 (x's dtype) experts."""
    e, h = logits.shape[1], x.shape[1]
    weights, ids = select_experts(x, logits, MoeRouting(top_k, renormalize=True))
    shape = {
        "local_num_experts": e,
        "hidden_size": h,
        "intermediate_size_per_partition": intermediate,
        "activation": SimpleNamespace(value="silu"),
    }
    w13 = (torch.randn(e, 2 * intermediate, h) * 0.02).to(x.dtype)
    w2 = (torch.randn(e, h, intermediate) * 0.02).to(x.dtype)
    calls = {"unquantized": lambda: fused_experts(x, w13, w2, weights, ids)}
    for name, (method, tensors) in quantized_layers(
        e, h, intermediate, x.dtype
    ).items():
        layer = SimpleNamespace(**shape, **tensors)
        calls[name] = lambda m=method, lay=layer: m.run_experts(lay, x, weights, ids)
    return calls
