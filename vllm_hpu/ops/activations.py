"""The gated activations of MoE experts, act(gate) * up, gpt-oss's clamped SwiGLU
and the activations of experts without a gate (Nemotron-H's squared ReLU), shared
by the expert forms in ops/moe.py and the stand-ins of Gaudi's MoE
kernels (no device import, so both can use them)."""

from collections.abc import Callable

import torch
import torch.nn.functional as F

# Activations of gated experts: act(gate) * up, with w13 holding gate then up.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}

# gpt-oss's clamped SwiGLU (vLLM's "swigluoai"): gate and up interleaved in w13,
# (up + 1) * gate * sigmoid(alpha * gate) after clamping both; vLLM's constants.
SWIGLUOAI = "swigluoai"
SWIGLUOAI_ALPHA = 1.702
SWIGLUOAI_LIMIT = 7.0
GATED_ACTIVATIONS = (*ACTIVATIONS, SWIGLUOAI)

# Experts without a gate: w13 holds only up, act(up) (vLLM's "_no_mul" names).
NON_GATED_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu2_no_mul": lambda x: F.relu(x).square(),
}


def swiglu_oai(h: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """[..., 2 * intermediate] with gate and up interleaved -> [..., intermediate]:
    the gate clamped from above, up on both sides, then (up + 1) * gate *
    sigmoid(alpha * gate)."""
    gate = h[..., ::2].clamp(max=limit)
    up = h[..., 1::2].clamp(min=-limit, max=limit)
    return (up + 1) * gate * torch.sigmoid(gate * alpha)


def gated(
    h: torch.Tensor,
    activation: str,
    swiglu_alpha: float = SWIGLUOAI_ALPHA,
    swiglu_limit: float = SWIGLUOAI_LIMIT,
) -> torch.Tensor:
    """[..., 2 * intermediate] -> [..., intermediate]: act(gate) * up, or the
    clamped SwiGLU with its gain and limit; [..., intermediate] kept so by a
    non-gated activation."""
    if activation in NON_GATED_ACTIVATIONS:
        return NON_GATED_ACTIVATIONS[activation](h)
    if activation == SWIGLUOAI:
        return swiglu_oai(h, swiglu_alpha, swiglu_limit)
    gate, up = h.chunk(2, dim=-1)
    return ACTIVATIONS[activation](gate) * up
