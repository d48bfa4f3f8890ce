"""FusedRMSNorm (bridge v1.19.0 hpex/normalization/FusedRMSNorm.py:28-58):
``FusedRMSNorm.apply(data_in, gamma, eps, use_stages=True, bwd_mode=0,
fast_math=False)`` runs hpu::rms_norm (or rms_norm_fast). The backward pass is
not modeled (inference only)."""

from enum import Enum
from typing import Any

import torch


class RmsNormBwdMode(Enum):
    DEFAULT = 0
    STATIC_CASE_WIDTH_PARTITIONING = 1


class FusedRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        data_in: torch.Tensor,
        gamma: torch.Tensor,
        eps: float,
        use_stages: bool = True,
        bwd_mode: int = 0,
        fast_math: bool = False,
    ) -> torch.Tensor:
        op = torch.ops.hpu.rms_norm_fast if fast_math else torch.ops.hpu.rms_norm
        return op(data_in, gamma, eps)[0]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        raise RuntimeError("HPU double: FusedRMSNorm backward is not modeled")
