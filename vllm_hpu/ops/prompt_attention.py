"""Prompt attention on a padded ``[bs, q]`` batch, optionally with each row's
cached context: keys ``[context blocks ; current tokens]``, masked by
``PromptBias`` (``ops/prompt_mask.py``), in tiles from ``PromptSlicing.threshold``."""

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from vllm_hpu import device
from vllm_hpu.ops.attention_kernels import PLAIN, AttentionKernels
from vllm_hpu.ops.paged_attention import score_dtype
from vllm_hpu.ops.prompt_mask import PromptBias
from vllm_hpu.ops.score_mods import Scoring, soft_cap, with_sinks
from vllm_hpu.ops.sliced_attention import (
    NO_SLICING,
    KeySource,
    PromptSlicing,
    TileAttention,
    TileGrid,
    sliced_attention,
)

# Head sizes FusedSDPA is validated with; others run the plain path.
FUSED_SDPA_HEAD_SIZES = (64, 80, 96, 112, 128, 192, 256)


def fused_unsupported_reason(
    head_size: int, logits_soft_cap: float | None, has_alibi: bool
) -> str:
    """What keeps a layer off the fused prompt kernel ('' when nothing does): the
    one place that decides, at start-up, which layers take the plain path."""
    if head_size not in FUSED_SDPA_HEAD_SIZES:
        return f"head size {head_size} (fused: {list(FUSED_SDPA_HEAD_SIZES)})"
    if logits_soft_cap is not None:
        return "logit soft-capping"
    if has_alibi:  # a 16-bit mask would round ALiBi's large biases
        return "ALiBi (its bias must stay in fp32)"
    return ""


def gather_context(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_list: torch.Tensor,
    batch_size: int,
    block_size: int,
    kernels: AttentionKernels = PLAIN,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Context blocks ``block_list`` [bs * C] (row-major, padding -> dummy block)
    -> past key and value, each [bs, C * block_size, num_kv_heads, head_size]."""
    past = []
    for cache, fetch in (
        (key_cache, kernels.fetch_keys),
        (value_cache, kernels.fetch_values),
    ):
        blocks = fetch(cache.unflatten(0, (-1, block_size)), block_list)
        past.append(blocks.reshape(batch_size, -1, *cache.shape[1:]))
    return past[0], past[1]


@dataclass(frozen=True)
class PassKeys:
    """The current tokens' keys and values [bs, q, KVH, D], after the context's
    from :func:`gather_context` (an fp8 cache's context is upcast as it is read)."""

    key: torch.Tensor
    value: torch.Tensor
    past: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def past_len(self) -> int:
        return 0 if self.past is None else self.past[0].shape[1]

    @property
    def num_keys(self) -> int:
        return self.past_len + self.key.shape[1]

    def read(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        past_len = self.past_len
        if start >= past_len:
            return self.key[:, start - past_len : end - past_len], self.value[
                :, start - past_len : end - past_len
            ]
        assert self.past is not None and end <= past_len
        return (
            self.past[0][:, start:end].to(self.key.dtype),
            self.past[1][:, start:end].to(self.value.dtype),
        )

    def whole(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.past is None:
            return self.key, self.value
        key = torch.cat((self.past[0].to(self.key.dtype), self.key), dim=1)
        value = torch.cat((self.past[1].to(self.value.dtype), self.value), dim=1)
        return key, value


def prompt_attention(
    query: torch.Tensor,
    keys: KeySource,
    bias: PromptBias,
    scoring: Scoring,
    kernels: AttentionKernels = PLAIN,
    slicing: PromptSlicing = NO_SLICING,
) -> torch.Tensor:
    """query [bs, q, heads, D]; keys: :class:`PassKeys` (or MLA's expanded latents)
    -> [bs, q, heads, value_size]. Each query sees itself (padded rows finite); with
    sinks, the statistics kernels run, never a quantizer's replacement."""
    if slicing.applies(keys.num_keys):
        grid = TileGrid(query.shape[1], keys.past_len, slicing.chunk_size, bias.causal)
        attend = tile_attention(scoring, kernels)
        return sliced_attention(attend, query, keys, bias.tile, grid, scoring.sinks)
    key, value = keys.whole()
    attn_bias = bias.whole()
    if scoring.sinks is not None:
        # One tile with its statistics, which the sinks join (score_mods).
        out, lse = tile_attention(scoring, kernels)(query, key, value, attn_bias)
        return with_sinks(out.float(), lse.float(), scoring.sinks).to(query.dtype)
    fused = device.fused_sdpa() if scoring.use_fused else None
    if fused is not None:
        return _fused_prompt_attention(
            kernels.fused_sdpa or fused.apply, query, key, value, attn_bias, scoring
        )
    return _naive_prompt_attention(query, key, value, attn_bias, scoring, kernels)


def _grouped_scores(
    query: torch.Tensor,
    key: torch.Tensor,
    attn_bias: torch.Tensor,
    scoring: Scoring,
    kernels: AttentionKernels,
) -> torch.Tensor:
    """Scaled, soft-capped, biased scores [bs, KVH, G, q, K] (fp32 for 16-bit), GQA
    heads folded into the query axis so a kv head's K serves its group unrepeated."""
    bs, q_len, num_heads, head_size = query.shape
    num_keys, num_kv_heads = key.shape[1], key.shape[2]
    group = num_heads // num_kv_heads
    # [bs, KVH, G * q, D]: heads of one group are adjacent in vLLM's layout.
    q = (query * scoring.scale).view(bs, q_len, num_kv_heads, group, head_size)
    q = q.permute(0, 2, 3, 1, 4).reshape(bs, num_kv_heads, group * q_len, head_size)
    k = key.to(query.dtype).permute(0, 2, 3, 1)  # [bs, KVH, D, K]
    scores = kernels.matmul_qk(q, k).to(score_dtype(query.dtype))
    scores = scores.view(bs, num_kv_heads, group, q_len, num_keys)
    scores = soft_cap(scores, scoring.logits_soft_cap)
    if attn_bias.shape[1] == num_heads:  # per-head bias (ALiBi)
        bias = attn_bias.unflatten(1, (num_kv_heads, group))
    else:
        bias = attn_bias.unsqueeze(1)
    return scores + bias.to(scores.dtype)


def _grouped_output(
    probs: torch.Tensor, value: torch.Tensor, kernels: AttentionKernels
) -> torch.Tensor:
    """probs [bs, KVH, G, q, K] @ value [bs, K, KVH, Dv] -> [bs, q, H, Dv]."""
    bs, num_kv_heads, group, q_len, num_keys = probs.shape
    v = value.to(probs.dtype).transpose(1, 2)  # [bs, KVH, K, Dv]
    out = kernels.matmul_av(probs.view(bs, num_kv_heads, group * q_len, num_keys), v)
    out = out.view(bs, num_kv_heads, group, q_len, -1).permute(0, 3, 1, 2, 4)
    return out.reshape(bs, q_len, num_kv_heads * group, -1)


def _by_query(stat: torch.Tensor) -> torch.Tensor:
    """A per-query statistic [bs, KVH, G, q, 1] -> [bs, q, H]."""
    bs, num_kv_heads, group, q_len, _ = stat.shape
    return stat.permute(0, 3, 1, 2, 4).reshape(bs, q_len, num_kv_heads * group)


def _naive_prompt_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_bias: torch.Tensor,
    scoring: Scoring,
    kernels: AttentionKernels,
) -> torch.Tensor:
    """Softmax attention over the whole pass in plain matmuls."""
    scores = _grouped_scores(query, key, attn_bias, scoring, kernels)
    probs = kernels.softmax(scores, -1).to(query.dtype)
    return _grouped_output(probs, value, kernels)


def _naive_tile(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_bias: torch.Tensor,
    scoring: Scoring,
    kernels: AttentionKernels,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One tile in plain matmuls, with its statistics (a :data:`TileAttention`)."""
    scores = _grouped_scores(query, key, attn_bias, scoring, kernels)
    top = scores.amax(dim=-1, keepdim=True)
    probs = torch.exp(scores - top)
    total = probs.sum(dim=-1, keepdim=True)
    out = _grouped_output(probs.to(query.dtype), value, kernels)
    lse = _by_query(top + torch.log(total))
    return out.float() / _by_query(total).unsqueeze(-1), lse


def _fused_tile(
    kernel: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    scale: float,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_bias: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One tile via ``device.fused_sdpa_stats``, GQA heads folded as plain."""
    bs, q_len, num_heads, head_size = query.shape
    num_kv_heads = key.shape[2]
    group = num_heads // num_kv_heads
    q = query.view(bs, q_len, num_kv_heads, group, head_size).permute(0, 2, 3, 1, 4)
    q = q.reshape(bs, num_kv_heads, group * q_len, head_size)
    if attn_bias.shape[1] == num_heads:
        mask = attn_bias.reshape(bs, num_kv_heads, group * q_len, -1)
    else:
        mask = attn_bias.unsqueeze(2).expand(bs, 1, group, q_len, -1)
        mask = mask.reshape(bs, 1, group * q_len, -1)
    out, lse = kernel(
        q, key.transpose(1, 2), value.transpose(1, 2), mask.to(q.dtype), scale
    )
    out = out.view(bs, num_kv_heads, group, q_len, -1).permute(0, 3, 1, 2, 4)
    lse = lse.view(bs, num_kv_heads, group, q_len).permute(0, 3, 1, 2)
    return out.reshape(bs, q_len, num_heads, -1), lse.reshape(bs, q_len, num_heads)


def tile_attention(scoring: Scoring, kernels: AttentionKernels) -> TileAttention:
    """The fused kernel with statistics where the layer may run fused, else the plain
    matmuls (a quantizer's replacement of ``fused_sdpa`` returns no statistics)."""
    fused: Any = device.fused_sdpa_stats() if scoring.use_fused else None
    if fused is not None:
        return partial(_fused_tile, fused, scoring.scale)
    return partial(_naive_tile, scoring=scoring, kernels=kernels)


def _fused_prompt_attention(
    fused_sdpa: Callable[..., torch.Tensor],
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_bias: torch.Tensor,
    scoring: Scoring,
) -> torch.Tensor:
    """The fused kernel (heads-first layout) with the same additive mask: Gaudi's
    FusedSDPA, or its CPU counterpart in emulation (``device.fused_sdpa``)."""
    out = fused_sdpa(
        query.transpose(1, 2),
        key.transpose(1, 2),
        value.transpose(1, 2),
        attn_bias,
        0.0,
        False,
        scoring.scale,
    )
    return out.transpose(1, 2)
