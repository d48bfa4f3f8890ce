"""Linear layers on the CPU: oneDNN matmuls on weights packed once, at load. MKL's
float32 sgemm is 3-4x slower for a decode step's rows on some CPUs
(docs/benchmarks.md), as vLLM's CPU backend knows; only emulation packs."""

import functools
from typing import Any

import torch
from vllm.logger import init_logger
from vllm.model_executor.layers.linear import UnquantizedLinearMethod
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    UnquantizedEmbeddingMethod,
)

logger = init_logger("vllm.hpu.packed_linear")


def _packed_linear(
    packed_weight: torch.Tensor,
    layer: torch.nn.Module,
    x: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight, bias, "none", [], "")


@functools.cache
def _can_pack(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs this dtype here (bf16 needs AVX-512 or AVX-NE-CONVERT)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(1, 1, dtype=dtype))
    except RuntimeError:
        return False
    return True


def _packable_weight(module: torch.nn.Module) -> torch.Tensor | None:
    """The weight of an unquantized linear layer or LM head oneDNN can pack (not the
    input embedding's); LoRA layers skipped: their packed base layer is called."""
    if hasattr(module, "base_layer"):
        return None
    method = type(getattr(module, "quant_method", None))
    is_lm_head = isinstance(module, ParallelLMHead)
    unquantized = method is UnquantizedLinearMethod or (
        method is UnquantizedEmbeddingMethod and is_lm_head
    )
    weight = getattr(module, "weight", None)
    if (
        unquantized
        and isinstance(weight, torch.Tensor)
        and weight.ndim == 2
        and _can_pack(weight.dtype)
    ):
        return weight
    return None


def pack_linear_layers(model: torch.nn.Module) -> int:
    """Pack ``model``'s linear weights for oneDNN (other dtypes keep ``F.linear``);
    returns the count. Layer weights dropped, the LM head's kept (tied embedding)."""
    packed = 0
    for module in model.modules():
        weight = _packable_weight(module)
        if weight is None:
            continue
        packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
        method: Any = module.quant_method
        method.apply = functools.partial(_packed_linear, packed_weight)
        if not isinstance(module, ParallelLMHead):
            module.weight = torch.nn.Parameter(weight.new_empty(0), requires_grad=False)
        packed += 1
    logger.info("Packed the weights of %d linear layers for oneDNN.", packed)
    return packed
