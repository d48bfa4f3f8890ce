"""The steps of attention a quantizer may replace: the two matmuls, the softmax,
the reads of the KV cache and the fused prompt kernel. The ops call them through
``AttentionKernels``; plain torch unless the attention layer passes its
submodules (``attention/inc_modules.py``), which Intel Neural Compressor patches."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


def fetch_blocks(blocks: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """Blocks ``block_ids`` [N] of a cache viewed as blocks [num_blocks + 1, ...]."""
    return blocks.index_select(0, block_ids)


def softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.softmax(x, dim=dim)


@dataclass(frozen=True)
class AttentionKernels:
    matmul_qk: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = torch.matmul
    softmax: Callable[[torch.Tensor, int], torch.Tensor] = softmax
    matmul_av: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = torch.matmul
    # (cache as blocks, block ids) -> blocks; an fp8 cache's reader may dequantize.
    fetch_keys: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = fetch_blocks
    fetch_values: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = fetch_blocks
    # FusedSDPA's call (q, k, v, mask, dropout_p, is_causal, scale), heads first;
    # None: the device's kernel (device.fused_sdpa) is called as it is.
    fused_sdpa: Callable[..., Any] | None = None


PLAIN = AttentionKernels()
