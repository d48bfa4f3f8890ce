"""Attention pieces INC measures and quantizes, as modules with the Gaudi
reference's class names (INC patches by class name; measurement files name
paths like ``model.layers.N.self_attn.attn.impl.matmul_qk``), so files made
here and on Gaudi are interchangeable. The math is in ops/."""

from typing import Any

import torch

from vllm_hpu.ops import attention_kernels
from vllm_hpu.ops.kv_cache import write_to_cache


class Matmul(torch.nn.Module):
    def forward(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        return torch.matmul(x, y, out=out)


class Softmax(torch.nn.Module):
    def forward(
        self, x: torch.Tensor, dim: int = -1, inv_head: Any = None
    ) -> torch.Tensor:
        return attention_kernels.softmax(x, dim)


class VLLMKVCache(torch.nn.Module):
    """Writes a step's keys (or values) into a flat cache; reads blocks back. Returns
    what it wrote, not the whole cache as the reference does (INC would process it)."""

    def forward(
        self, input: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor
    ) -> torch.Tensor:
        write_to_cache(cache, slot_mapping, input)
        return input

    def fetch_from_cache(
        self, cache: torch.Tensor, blocks: torch.Tensor
    ) -> torch.Tensor:
        return attention_kernels.fetch_blocks(cache, blocks)


class ModuleFusedSDPA(torch.nn.Module):
    """The fused prompt kernel (``device.fused_sdpa``) as a module."""

    def __init__(self, fused_sdpa: Any) -> None:
        super().__init__()
        self._hpu_kernel_fsdpa = fused_sdpa

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None,
        dropout_p: float,
        is_causal: bool,
        scale: float,
        *unused: Any,
    ) -> torch.Tensor:
        return self._hpu_kernel_fsdpa.apply(
            query, key, value, attn_mask, dropout_p, is_causal, scale
        )
