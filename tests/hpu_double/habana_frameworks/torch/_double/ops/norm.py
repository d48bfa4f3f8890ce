"""hpu::rms_norm and hpu::rms_norm_fast(data_in, gamma, epsilon) -> (out,
inverse_rms): out = data_in / sqrt(mean(data_in**2, -1) + epsilon) * gamma,
computed in float32 (bridge v1.19.0 scripts/hpu_op.yaml rms_norm entries)."""

from typing import Any

import torch

from habana_frameworks.torch._double.ops import define, host, to_device

SCHEMAS = (
    "rms_norm(Tensor data_in, Tensor gamma, float epsilon) -> (Tensor, Tensor)",
    "rms_norm_fast(Tensor data_in, Tensor gamma, float epsilon) -> (Tensor, Tensor)",
)


def rms_norm(
    data_in: torch.Tensor, gamma: torch.Tensor, epsilon: float
) -> tuple[torch.Tensor, torch.Tensor]:
    x = host(data_in).float()
    inverse_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + epsilon)
    out = x * inverse_rms * host(gamma).float()
    return to_device(out.to(data_in.dtype)), to_device(inverse_rms)


def _fake(
    data_in: torch.Tensor, gamma: torch.Tensor, epsilon: float
) -> tuple[Any, Any]:
    stats = (*data_in.shape[:-1], 1)
    return torch.empty_like(data_in), data_in.new_empty(stats, dtype=torch.float32)


def register() -> None:
    for schema in SCHEMAS:
        define(schema, rms_norm, _fake)
