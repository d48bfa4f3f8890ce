"""Attention of multimodal encoders (vision towers) over a whole padded pass.

vLLM's torch path splits a pass at ``cu_seqlens`` and attends image by image, so
the attention's shapes follow each image's patch count: on Gaudi, a graph per
image size. Here one attention covers the pass and a block-diagonal mask keeps
the images apart, so the shapes follow only the pass's (images, patches) bucket.
"""

import torch

from vllm_hpu.ops.prompt_attention import FUSED_SDPA_HEAD_SIZES, prompt_attention
from vllm_hpu.ops.score_mods import Scoring


def block_diagonal_bias(
    cu_seqlens: torch.Tensor | None,
    seq_len: int,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """Additive mask [1, 1, seq_len, seq_len]: token i sees token j only when both
    lie in one span ``[cu_seqlens[k], cu_seqlens[k + 1])``; all zeros (full
    attention) without ``cu_seqlens``.

    cu_seqlens: [num_images + 1] int, non-decreasing. Repeated values are empty
    images; tokens at or past ``cu_seqlens[-1]`` form one more span of their own.
    Built by comparisons only (no read of the values), so its shapes depend on
    ``seq_len`` and ``num_images``, never on the images' lengths. Every token sees
    itself, so no row is fully masked."""
    bias = torch.zeros((1, 1, seq_len, seq_len), dtype=dtype, device=device)
    if cu_seqlens is None:
        return bias
    positions = torch.arange(seq_len, device=device)
    ends = cu_seqlens[1:].to(device=device, dtype=positions.dtype)
    image_ids = (positions[:, None] >= ends[None, :]).sum(dim=-1)  # [seq_len]
    same_image = image_ids[:, None] == image_ids[None, :]
    return bias.masked_fill_(~same_image, float("-inf"))


def encoder_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Non-causal attention of every batch row, within the spans of ``cu_seqlens``
    (the same spans in every row) or over the whole row without it.

    query: [batch, seq_len, num_heads, head_size]; key, value: [batch, seq_len,
    num_kv_heads, head_size]; cu_seqlens: [num_images + 1] or None. Returns
    [batch, seq_len, num_heads, head_size]. Runs Gaudi's fused SDPA (its CPU
    counterpart in emulation, ``device.fused_sdpa``) for the head sizes it takes,
    plain softmax attention otherwise; both through :func:`prompt_attention`."""
    batch, seq_len, _, head_size = query.shape
    bias = block_diagonal_bias(cu_seqlens, seq_len, query.dtype, query.device)
    bias = bias.expand(batch, -1, -1, -1)
    scoring = Scoring(scale, use_fused=head_size in FUSED_SDPA_HEAD_SIZES)
    return prompt_attention(query, key, value, bias, scoring)
