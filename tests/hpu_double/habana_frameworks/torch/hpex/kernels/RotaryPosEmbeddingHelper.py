"""Rotary position embedding (bridge v1.19.0
hpex/kernels/RotaryPosEmbeddingHelper.py).

``apply_rotary_pos_emb(p, cos, sin, position_ids=None, offset=0, mode)`` is the
general entry; ``RotaryPosEmbeddingHelperV1.apply(p, cos, sin, offset)`` takes
exactly four arguments and is always BLOCKWISE, ``V2.apply(p, cos, sin,
position_ids)`` likewise. Backward passes are not modeled (inference only).
"""

from enum import Enum
from typing import Any

import torch


class RotaryPosEmbeddingMode(Enum):
    BLOCKWISE = 0
    PAIRWISE = 1


def _matching_dtypes(
    p: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """float32 if any of the three is, else the input's dtype (match_data_types)."""
    if torch.float32 in (p.dtype, cos.dtype, sin.dtype):
        return p.float(), cos.float(), sin.float()
    return p, cos.to(p.dtype), sin.to(p.dtype)


def apply_rotary_pos_emb(p: torch.Tensor, *args: Any) -> torch.Tensor:
    if len(args) <= 1:
        raise RuntimeError(
            "HPU double: the ChatGLM rope_cache form (V3) is not modeled"
        )
    cos, sin = args[0], args[1]
    position_ids = args[2] if len(args) > 2 else None
    offset = args[3] if len(args) > 3 else 0
    mode = args[4] if len(args) > 4 else RotaryPosEmbeddingMode.BLOCKWISE
    p, cos, sin = _matching_dtypes(p, cos, sin)
    return torch.ops.hpu.rotary_pos_embedding(
        p, sin, cos, position_ids, offset, mode.value
    )


class RotaryPosEmbeddingHelperV1(torch.autograd.Function):
    """GPT-NeoX style (transformers <= 4.27.4), as used for LLaMA."""

    @staticmethod
    def forward(
        ctx: Any, p: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, offset: int
    ) -> torch.Tensor:
        return apply_rotary_pos_emb(
            p, cos, sin, None, offset, RotaryPosEmbeddingMode.BLOCKWISE
        )

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        raise RuntimeError(
            "HPU double: RotaryPosEmbeddingHelperV1 backward is not modeled"
        )


class RotaryPosEmbeddingHelperV2(torch.autograd.Function):
    """transformers > 4.27.4 style, with position ids."""

    @staticmethod
    def forward(
        ctx: Any,
        p: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        position_ids: torch.Tensor,
    ) -> torch.Tensor:
        return apply_rotary_pos_emb(
            p, cos, sin, position_ids, 0, RotaryPosEmbeddingMode.BLOCKWISE
        )

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        raise RuntimeError(
            "HPU double: RotaryPosEmbeddingHelperV2 backward is not modeled"
        )
