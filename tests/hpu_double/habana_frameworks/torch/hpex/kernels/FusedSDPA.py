"""FusedSDPA (bridge v1.19.0 hpex/kernels/FusedSDPA.py:235-268).

``FusedSDPA.apply(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
scale=None, softmax_mode="None", recompute_mode=None, valid_seq_len=None,
seq_padding_type="left", return_dropout_mask=False, return_attn_probs=False)``,
heads first. Grouped K/V (fewer heads, more than one) are reshaped to
[batch, groups, heads_per_group, ...] and broadcast, not repeated, as the
bridge does; the recompute kernel (the default) or the plain one runs.
"""

import math
from typing import Any

import torch

_recompute_enabled = True


def recompute_sdp_enabled() -> bool:
    return _recompute_enabled


def _is_gqa(q: torch.Tensor, k: torch.Tensor) -> bool:
    return q.dim() == 4 and q.shape[1] != k.shape[1] and k.shape[1] != 1


def _grouped(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any
) -> tuple[Any, ...]:
    batch, heads, q_len, size = q.shape
    groups = k.shape[1]
    q = q.reshape(batch, groups, heads // groups, q_len, size)
    k = k.reshape(batch, groups, 1, k.shape[2], k.shape[3])
    v = v.reshape(batch, groups, 1, v.shape[2], v.shape[3])
    if mask is not None:
        if mask.shape[1] == heads:
            mask = mask.reshape(mask.shape[0], groups, heads // groups, *mask.shape[2:])
        else:
            mask = mask.unsqueeze(1)
    return q, k, v, mask


def _ungrouped(out: torch.Tensor) -> torch.Tensor:
    batch, groups, per_group, q_len, size = out.shape
    return out.reshape(batch, groups * per_group, q_len, size)


class FusedSDPA(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        softmax_mode: str = "None",
        recompute_mode: bool | None = None,
        valid_seq_len: torch.Tensor | None = None,
        seq_padding_type: str = "left",
        return_dropout_mask: bool = False,
        return_attn_probs: bool = False,
    ) -> Any:
        scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
        recompute = (
            recompute_sdp_enabled() if recompute_mode is None else recompute_mode
        )
        if valid_seq_len is not None:
            assert is_causal and attn_mask is None, (
                "Valid sequence length is supported only in inference with "
                "is_causal(triangular) mask case"
            )
        gqa = _is_gqa(q, k)
        if gqa:
            q, k, v, attn_mask = _grouped(q, k, v, attn_mask)
        mode, padding = softmax_mode.lower(), seq_padding_type.lower()
        if recompute and not return_attn_probs:
            out = torch.ops.hpu.sdpa_recomp_fwd(
                q,
                k,
                v,
                attn_mask,
                dropout_p,
                scale,
                is_causal,
                False,
                mode,
                valid_seq_len,
                padding,
            )[0]
        else:
            out = torch.ops.hpu.sdpa_fwd(
                q,
                k,
                v,
                attn_mask,
                dropout_p,
                scale,
                is_causal,
                mode,
                valid_seq_len,
                padding,
            )[0]
        return _ungrouped(out) if gqa else out

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        raise RuntimeError("HPU double: FusedSDPA backward is not modeled")
