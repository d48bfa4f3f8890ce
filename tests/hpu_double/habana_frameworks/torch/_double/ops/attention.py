"""hpu::sdpa_recomp_fwd and hpu::sdpa_fwd: fused attention forward.

Inputs are heads first: q [batch, heads, q_len, head_size] or, for grouped K/V
as FusedSDPA reshapes them, q [batch, groups, heads_per_group, q_len, head_size]
with k, v [batch, groups, 1, kv_len, head_size]. ``attention_mask`` is added to
the scores; ``is_causal`` masks key j > query i; ``valid_seq_len`` [batch] keeps
that many positions (at the end with "left" padding, at the start with "right").
sdpa_recomp_fwd returns (out, row max m, 1 / row sum linv, seed): the softmax of
the scores s is exp(s - m) * linv. Rows with every key masked give zeros.
"""

from typing import Any

import torch

from habana_frameworks.torch._double.ops import define, host, to_device

SDPA_RECOMP_FWD = (
    "sdpa_recomp_fwd(Tensor q, Tensor k, Tensor v, Tensor? attention_mask, float p, "
    "float scale, bool is_causal, bool requires_backward, str softmax_mode, "
    "Tensor? valid_seq_len, str seq_padding_type) -> (Tensor, Tensor, Tensor, Tensor)"
)
SDPA_FWD = (
    "sdpa_fwd(Tensor q, Tensor k, Tensor v, Tensor? attention_mask, float p, "
    "float scale, bool is_causal, str softmax_mode, Tensor? valid_seq_len, "
    "str seq_padding_type) -> (Tensor, Tensor, Tensor)"
)


def _valid_keys(valid_seq_len: torch.Tensor, length: int, padding: str) -> torch.Tensor:
    """[batch, length] True where a position holds a token."""
    positions = torch.arange(length)
    valid = valid_seq_len.reshape(-1, 1).long()
    if padding.lower() == "left":
        return positions >= (length - valid)
    return positions < valid


def _scores(
    q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask.float()
    return scores


def _masked(
    scores: torch.Tensor, is_causal: bool, valid: torch.Tensor | None
) -> torch.Tensor:
    q_len, kv_len = scores.shape[-2], scores.shape[-1]
    if is_causal:
        causal = torch.ones(q_len, kv_len, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if valid is not None:
        shape = [valid.shape[0]] + [1] * (scores.dim() - 2) + [kv_len]
        scores = scores.masked_fill(~valid.reshape(shape), float("-inf"))
    return scores


def _attend(args: tuple[Any, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, m, linv) on host tensors."""
    q, k, v, mask, scale, is_causal, valid_seq_len, padding = args
    valid = None
    if valid_seq_len is not None:
        valid = _valid_keys(valid_seq_len, k.shape[-2], padding)
    scores = _masked(_scores(q, k, mask, scale), is_causal, valid)
    row_max = scores.amax(dim=-1, keepdim=True)
    finite_max = torch.where(
        torch.isfinite(row_max), row_max, torch.zeros_like(row_max)
    )
    weights = torch.exp(scores - finite_max)
    total = weights.sum(dim=-1, keepdim=True)
    linv = torch.where(total > 0, 1.0 / total, torch.zeros_like(total))
    out = torch.matmul(weights * linv, v.float())
    return out.to(q.dtype), row_max.to(q.dtype), linv


def sdpa_recomp_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attention_mask: torch.Tensor | None,
    p: float,
    scale: float,
    is_causal: bool,
    requires_backward: bool,
    softmax_mode: str,
    valid_seq_len: torch.Tensor | None,
    seq_padding_type: str,
) -> tuple[torch.Tensor, ...]:
    if p > 0.0:
        raise RuntimeError("HPU double: sdpa_recomp_fwd with dropout is not modeled")
    args = (host(q), host(k), host(v), host(attention_mask), scale, is_causal,
            host(valid_seq_len), seq_padding_type)  # fmt: skip
    out, row_max, linv = _attend(args)
    seed = torch.zeros(1, dtype=torch.int32)
    return to_device(out), to_device(row_max), to_device(linv), to_device(seed)


def sdpa_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attention_mask: torch.Tensor | None,
    p: float,
    scale: float,
    is_causal: bool,
    softmax_mode: str,
    valid_seq_len: torch.Tensor | None,
    seq_padding_type: str,
) -> tuple[torch.Tensor, ...]:
    if p > 0.0:
        raise RuntimeError("HPU double: sdpa_fwd with dropout is not modeled")
    args = (host(q), host(k), host(v), host(attention_mask), scale, is_causal,
            host(valid_seq_len), seq_padding_type)  # fmt: skip
    out, _, _ = _attend(args)
    empty = torch.empty(0, dtype=q.dtype)
    return to_device(out), to_device(empty), to_device(empty.clone())


def _fake_recomp(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any
) -> tuple[torch.Tensor, ...]:
    stats = (*q.shape[:-1], 1)
    out = q.new_empty(q.shape[:-1] + v.shape[-1:])
    return (
        out,
        q.new_empty(stats),
        q.new_empty(stats, dtype=torch.float32),
        q.new_empty(1, dtype=torch.int32),
    )


def _fake_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any
) -> tuple[torch.Tensor, ...]:
    out = q.new_empty(q.shape[:-1] + v.shape[-1:])
    return out, q.new_empty(0), q.new_empty(0)


def register() -> None:
    define(SDPA_RECOMP_FWD, sdpa_recomp_fwd, _fake_recomp)
    define(SDPA_FWD, sdpa_fwd, _fake_fwd)
