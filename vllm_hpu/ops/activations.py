"""The gated activations of MoE experts, act(gate) * up, shared by the expert
forms in ops/moe.py and the stand-ins of Gaudi's MoE kernels (no device import,
so both can use them)."""

from collections.abc import Callable

import torch
import torch.nn.functional as F

# Activations of gated experts: act(gate) * up, with w13 holding gate then up.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def gated(h: torch.Tensor, activation: str) -> torch.Tensor:
    """[..., 2 * intermediate] -> [..., intermediate]: act(gate) * up."""
    gate, up = h.chunk(2, dim=-1)
    return ACTIVATIONS[activation](gate) * up
