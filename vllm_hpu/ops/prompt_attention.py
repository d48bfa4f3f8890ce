"""Prompt (prefill) attention on a padded ``[bs, q]`` batch, optionally with the
cached context of each row (prefix-cache hits, later chunks of a chunked prompt).

Keys are ``[context blocks from the cache ; current tokens]``; the additive mask
``attn_bias`` (built once per step by the metadata builder) does the rest.
"""

from collections.abc import Callable

import torch

from vllm_hpu import device
from vllm_hpu.ops.attention_kernels import PLAIN, AttentionKernels
from vllm_hpu.ops.paged_attention import score_dtype
from vllm_hpu.ops.score_mods import (
    Scoring,
    alibi_bias,
    soft_cap,
    softmax_with_sinks,
)

# Head sizes the fused kernel (Gaudi's FusedSDPA) is validated with; any other
# size runs the plain path.
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


def bias_with_alibi(
    attn_bias: torch.Tensor, distance: torch.Tensor, slopes: torch.Tensor
) -> torch.Tensor:
    """attn_bias [bs, 1, q, K] plus ALiBi -> [bs, num_heads, q, K] fp32.
    distance: [bs, q, K] key minus query position; slopes: [num_heads] fp32."""
    return attn_bias + alibi_bias(slopes, distance)


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


def bidirectional_bias(
    query_lens: torch.Tensor, query_len: int, dtype: torch.dtype
) -> torch.Tensor:
    """[bs, 1, q, q] mask of encoder-only (non-causal) attention without context:
    every real token sees every real token of its row. query_lens: [bs] real
    tokens per row. The diagonal stays visible so padded rows come out finite."""
    keys = torch.arange(query_len, device=query_lens.device)
    allowed = (keys[None, None, :] < query_lens[:, None, None]) | (
        keys[:, None] == keys[None, :]
    )
    bias = torch.zeros(allowed.shape, dtype=dtype, device=query_lens.device)
    return bias.masked_fill_(~allowed, float("-inf")).unsqueeze(1)


def prompt_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_bias: torch.Tensor,
    scoring: Scoring,
    past_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    kernels: AttentionKernels = PLAIN,
) -> torch.Tensor:
    """query: [bs, q, num_heads, head_size]; key, value: [bs, q, num_kv_heads,
    head_size]; attn_bias: [bs, 1 or num_heads, q, K] with K = past tokens + q;
    past_kv from :func:`gather_context` or None. Returns [bs, q, num_heads,
    head_size].

    Every query row, padding included, may see at least itself (the mask allows
    the diagonal), so padded rows come out finite. With context the query is
    shorter than the keys; the fused kernel takes that too, through the mask.
    """
    if past_kv is not None:  # an fp8 cache's context is upcast before the cat
        key = torch.cat((past_kv[0].to(key.dtype), key), dim=1)
        value = torch.cat((past_kv[1].to(value.dtype), value), dim=1)
    fused = device.fused_sdpa() if scoring.use_fused else None
    if fused is not None:
        return _fused_prompt_attention(
            kernels.fused_sdpa or fused.apply, query, key, value, attn_bias, scoring
        )
    return _naive_prompt_attention(query, key, value, attn_bias, scoring, kernels)


def _naive_prompt_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_bias: torch.Tensor,
    scoring: Scoring,
    kernels: AttentionKernels,
) -> torch.Tensor:
    """Softmax attention with grouped-query heads folded into the query axis,
    so K/V of a kv head are shared by its group without being repeated."""
    bs, q_len, num_heads, head_size = query.shape
    num_keys, num_kv_heads = key.shape[1], key.shape[2]
    group = num_heads // num_kv_heads
    # [bs, KVH, G * q, D]: heads of one group are adjacent in vLLM's layout.
    q = (query * scoring.scale).view(bs, q_len, num_kv_heads, group, head_size)
    q = q.permute(0, 2, 3, 1, 4).reshape(bs, num_kv_heads, group * q_len, head_size)
    k = key.to(query.dtype).permute(0, 2, 3, 1)  # [bs, KVH, D, K]
    v = value.to(query.dtype).transpose(1, 2)  # [bs, KVH, K, D]

    scores = kernels.matmul_qk(q, k).to(score_dtype(query.dtype))
    scores = scores.view(bs, num_kv_heads, group, q_len, num_keys)
    scores = soft_cap(scores, scoring.logits_soft_cap)
    if attn_bias.shape[1] == num_heads:  # per-head bias (ALiBi)
        bias = attn_bias.unflatten(1, (num_kv_heads, group))
    else:
        bias = attn_bias.unsqueeze(1)
    scores = scores + bias.to(scores.dtype)
    sinks = None
    if scoring.sinks is not None:
        sinks = scoring.sinks.view(num_kv_heads, group, 1, 1)
    probs = softmax_with_sinks(scores, sinks, kernels.softmax).to(query.dtype)
    probs = probs.reshape(bs, num_kv_heads, group * q_len, num_keys)
    out = kernels.matmul_av(probs, v)
    out = out.view(bs, num_kv_heads, group, q_len, head_size).permute(0, 3, 1, 2, 4)
    return out.reshape(bs, q_len, num_heads, head_size)


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
    if scoring.sinks is not None:
        key, value, attn_bias = with_sink_key(key, value, attn_bias, scoring.sinks)
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


def with_sink_key(
    key: torch.Tensor,
    value: torch.Tensor,
    attn_bias: torch.Tensor,
    sinks: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention sinks for a kernel that takes an additive mask but no sinks: one
    more key and value of zeros per row, whose mask column holds each head's sink
    (q . 0 = 0), so the sink joins the softmax's denominator and adds nothing to
    the output. key, value: [bs, K, num_kv_heads, D]; attn_bias: [bs, 1 or
    num_heads, q, K]; sinks: [num_heads]. The mask becomes per head [bs,
    num_heads, q, K + 1], in its own dtype (a 16-bit model's sinks are 16-bit)."""
    batch_size, _, q_len, _ = attn_bias.shape
    num_heads = sinks.shape[0]
    bias = attn_bias.expand(batch_size, num_heads, q_len, -1)
    column = sinks.to(attn_bias.dtype).view(1, num_heads, 1, 1)
    bias = torch.cat((bias, column.expand(batch_size, -1, q_len, 1)), dim=-1)
    key = torch.cat((key, key.new_zeros(batch_size, 1, *key.shape[2:])), dim=1)
    value = torch.cat((value, value.new_zeros(batch_size, 1, *value.shape[2:])), dim=1)
    return key, value, bias
