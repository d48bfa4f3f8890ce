"""Attention of multimodal encoders over a whole padded pass: vLLM attends image
by image (a graph per image size on Gaudi); one block-diagonal mask makes the
shapes follow only the pass's (images, patches) bucket."""

import torch

from vllm_hpu.ops.prompt_attention import (
    FUSED_SDPA_HEAD_SIZES,
    PassKeys,
    prompt_attention,
)
from vllm_hpu.ops.prompt_mask import PromptBias, PromptMask
from vllm_hpu.ops.score_mods import Scoring
from vllm_hpu.ops.sliced_attention import NO_SLICING, PromptSlicing


def block_diagonal_mask(
    cu_seqlens: torch.Tensor | None, batch: int, seq_len: int, device: torch.device
) -> PromptMask:
    """Bidirectional mask of ``batch`` rows of ``seq_len``: i sees j only within one
    span ``[cu_seqlens[k], cu_seqlens[k + 1])`` (tokens past ``cu_seqlens[-1]`` form
    one more); no ``cu_seqlens``: all. Comparisons only, so shapes stay static."""
    positions = torch.arange(seq_len, device=device)
    image_ids = torch.zeros_like(positions)
    if cu_seqlens is not None:
        ends = cu_seqlens[1:].to(device=device, dtype=positions.dtype)
        image_ids = (positions[:, None] >= ends[None, :]).sum(dim=-1)  # [seq_len]
    owners = image_ids.expand(batch, -1)
    positions = positions.expand(batch, -1)
    return PromptMask(owners, positions, owners, positions, causal=False)


def encoder_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    cu_seqlens: torch.Tensor | None = None,
    slicing: PromptSlicing = NO_SLICING,
) -> torch.Tensor:
    """Non-causal attention within ``cu_seqlens`` spans (alike in every row) or whole
    rows: query [batch, seq, heads, D], key/value [batch, seq, kv_heads, D] -> query's
    shape; ``slicing.threshold`` patches or more run in tiles (no 2 GiB [P, P] mask)."""
    batch, seq_len, _, head_size = query.shape
    mask = block_diagonal_mask(cu_seqlens, batch, seq_len, query.device)
    scoring = Scoring(scale, use_fused=head_size in FUSED_SDPA_HEAD_SIZES)
    bias = PromptBias(mask, query.dtype)
    return prompt_attention(query, PassKeys(key, value), bias, scoring, slicing=slicing)
