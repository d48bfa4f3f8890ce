"""What attention layers change in raw scores besides the mask: the softmax scale,
logit soft-capping (Gemma 2), ALiBi position biases (Bloom, Falcon) and attention
sinks (gpt-oss), one learned logit per head that joins every softmax."""

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Scoring:
    """How a layer turns ``q . k`` into the scores its softmax sees."""

    scale: float
    logits_soft_cap: float | None = None  # scores -> tanh(scores / cap) * cap
    use_fused: bool = True  # False: the fused prompt kernel cannot run this layer
    # [num_heads]: a logit per head with no value, in the softmax's denominator
    # only; read at each call (the model's parameter, loaded after construction).
    sinks: torch.Tensor | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.use_fused and self.logits_soft_cap is not None:
            raise ValueError("the fused prompt kernel has no logit soft-capping")


def soft_cap(scores: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Squash scaled scores into (-cap, cap); applied before any bias or mask."""
    if cap is None:
        return scores
    return torch.tanh(scores / cap) * cap


def alibi_bias(slopes: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
    """Per-head linear bias per pass (no [heads, seq, seq] table): slopes [num_heads]
    fp32, distance [N, ...] (key - query position) -> [N, num_heads, ...] fp32."""
    shape = (1, -1) + (1,) * (distance.dim() - 1)
    return slopes.view(shape) * distance.unsqueeze(1).to(slopes.dtype)


def with_sinks(
    out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor | None
) -> torch.Tensor:
    """Normalise attention over its keys and each head's sink (a logit with no
    value): ``out`` scaled by exp(lse) / (exp(lse) + exp(sink)). out: [...,
    num_heads, Dv]; lse: [..., num_heads]; sinks: [num_heads] or None (no change)."""
    if sinks is None:
        return out
    share = torch.sigmoid(lse - sinks.to(lse.dtype))
    return out * share.unsqueeze(-1).to(out.dtype)
