"""What attention layers change in raw scores besides the mask: the softmax scale,
logit soft-capping (Gemma 2), ALiBi position biases (Bloom, Falcon) and attention
sinks (gpt-oss), one learned logit per head that joins every softmax."""

from collections.abc import Callable
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
    """Per-head linear bias, made per pass for the keys it attends (never a full
    [heads, seq, seq] table). slopes: [num_heads] fp32; distance: [N, ...] key
    position minus query position -> [N, num_heads, ...] fp32."""
    shape = (1, -1) + (1,) * (distance.dim() - 1)
    return slopes.view(shape) * distance.unsqueeze(1).to(slopes.dtype)


def softmax_with_sinks(
    scores: torch.Tensor,
    sinks: torch.Tensor | None,
    softmax: Callable[[torch.Tensor, int], torch.Tensor],
) -> torch.Tensor:
    """softmax over the last axis of ``scores``, each head's sink joining it as
    one more column that is dropped after (a row then sums to less than 1).
    sinks: one logit per head, shaped to broadcast to ``scores[..., :1]``."""
    if sinks is None:
        return softmax(scores, -1)
    column = sinks.to(scores.dtype).expand(*scores.shape[:-1], 1)
    return softmax(torch.cat((scores, column), dim=-1), -1)[..., :-1]
