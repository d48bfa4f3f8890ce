"""Multi-head latent attention (DeepSeek-V2/V3) on one flat latent cache per layer.

A cache row is ``[kv_c (kv_lora_rank) ; k_pe (qk_rope_head_dim)]`` of a token.
Decode attends in latent space (MQA: one head, the latent is also the value);
prompts expand the latent through ``kv_b_proj`` into per-head keys and values.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vllm_hpu.ops.attention_kernels import PLAIN
from vllm_hpu.ops.kv_cache import gather_blocks, gather_blocks_by_head
from vllm_hpu.ops.paged_attention import (
    ALL_BLOCKS,
    DecodeBlocks,
    sliced_block_attention,
)
from vllm_hpu.ops.prompt_attention import prompt_attention
from vllm_hpu.ops.prompt_mask import PromptBias
from vllm_hpu.ops.score_mods import Scoring
from vllm_hpu.ops.sliced_attention import NO_SLICING, PromptSlicing


def latent_cache_shape(
    num_blocks: int, block_size: int, latent_size: int
) -> tuple[int, int]:
    """``((num_blocks + 1) * block_size, latent_size)``: one extra dummy block."""
    return ((num_blocks + 1) * block_size, latent_size)


def allocate_latent_cache(
    num_blocks: int,
    block_size: int,
    latent_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """A zeroed flat latent cache (see :func:`latent_cache_shape`)."""
    shape = latent_cache_shape(num_blocks, block_size, latent_size)
    return torch.zeros(shape, dtype=dtype, device=device)


def write_latent_to_cache(
    cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_c_normed: torch.Tensor,
    k_pe: torch.Tensor,
) -> None:
    """cache[slot_mapping[i]] = [kv_c_normed[i] ; k_pe[i]]; kv_c_normed:
    [num_tokens, kv_lora_rank]; k_pe: [num_tokens, 1, rope] or [num_tokens, rope]."""
    latent = torch.cat((kv_c_normed, k_pe.flatten(1)), dim=-1)
    cache.index_copy_(0, slot_mapping, latent.to(cache.dtype))


def latent_decode_attention(
    query: torch.Tensor,
    cache: torch.Tensor,
    blocks: DecodeBlocks,
    scale: float,
    kv_lora_rank: int,
    block_slice: int = ALL_BLOCKS,
) -> torch.Tensor:
    """Flat decode attention in latent space. query: [bs, num_heads, kv_lora_rank
    + rope] (the no-rope part already absorbed through W_UK); cache: [slots,
    kv_lora_rank + rope]. Returns [bs, num_heads, kv_lora_rank], still to be
    projected through W_UV. The blocks are gathered once (``block_slice`` at a
    time): the value is the key's latent part."""
    block_size = blocks.block_bias.shape[-1]

    def gather(part: DecodeBlocks) -> tuple[torch.Tensor, torch.Tensor]:
        keys = gather_blocks_by_head(cache.unsqueeze(1), part.block_list, block_size)
        return keys, keys[..., :kv_lora_rank]

    return sliced_block_attention(
        query, gather, blocks, Scoring(scale), PLAIN, block_slice
    )


def gather_latent_context(
    cache: torch.Tensor, block_list: torch.Tensor, batch_size: int, block_size: int
) -> torch.Tensor:
    """Context blocks ``block_list`` [bs * C] (row-major, padding -> dummy block)
    -> their latent rows, [bs, C * block_size, kv_lora_rank + rope]."""
    blocks = gather_blocks(cache, block_list, block_size)
    return blocks.reshape(batch_size, -1, cache.shape[-1])


@dataclass(frozen=True)
class LatentExpansion:
    """How a layer turns cached latents into per-head keys and values."""

    kv_b_proj: Callable[[torch.Tensor], torch.Tensor]  # [T, L] -> [T, N * (P + V)]
    num_heads: int
    kv_lora_rank: int  # L
    qk_nope_head_dim: int  # P
    v_head_dim: int  # V

    def __call__(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """latent: [..., L + R] -> key [..., N, P + R] (the rope part shared by
        every head), value [..., N, V]."""
        lead = latent.shape[:-1]
        kv_c, k_pe = latent.split(
            [self.kv_lora_rank, latent.shape[-1] - self.kv_lora_rank], dim=-1
        )
        kv = self.kv_b_proj(kv_c.reshape(-1, self.kv_lora_rank))
        kv = kv.view(*lead, self.num_heads, -1)
        k_nope, value = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        k_pe = k_pe.unsqueeze(-2).expand(*lead, self.num_heads, k_pe.shape[-1])
        return torch.cat((k_nope, k_pe), dim=-1), value


def _pad_head(x: torch.Tensor, size: int) -> torch.Tensor:
    """Zero-pad the last dim to ``size``: zeros add nothing to scores or values."""
    return F.pad(x, (0, size - x.shape[-1])) if x.shape[-1] < size else x


@dataclass(frozen=True)
class LatentKeys:
    """A prompt pass's keys as cached latents [bs, C * B, L + R] and the current
    tokens' [bs, q, L + R], expanded per head only as they are read, so a pass
    over a long context holds the expansion of one tile of keys at a time. Keys
    and values come out padded with zeros to ``head_size`` (the query's, or the
    value's if larger): the fused kernel wants one head size."""

    latent: torch.Tensor
    past_latent: torch.Tensor | None
    expand: LatentExpansion
    head_size: int

    @property
    def past_len(self) -> int:
        return 0 if self.past_latent is None else self.past_latent.shape[1]

    @property
    def num_keys(self) -> int:
        return self.past_len + self.latent.shape[1]

    def read(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        past_len = self.past_len
        if start >= past_len:
            return self._expanded(self.latent[:, start - past_len : end - past_len])
        assert self.past_latent is not None
        return self._expanded(self.past_latent[:, start:end])

    def whole(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.past_latent is None:
            return self._expanded(self.latent)
        return self._expanded(torch.cat((self.past_latent, self.latent), dim=1))

    def _expanded(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        key, value = self.expand(latent)
        return _pad_head(key, self.head_size), _pad_head(value, self.head_size)


def latent_prompt_attention(
    query: torch.Tensor,
    keys: LatentKeys,
    bias: PromptBias,
    scale: float,
    slicing: PromptSlicing = NO_SLICING,
) -> torch.Tensor:
    """Prompt attention over expanded latents. query: [bs, q, N, P + R]; keys
    from the pass's latents (:class:`LatentKeys`); bias over [bs, q] x [bs, K + q].
    Returns [bs, q, N, V]."""
    out = prompt_attention(
        _pad_head(query, keys.head_size),
        keys,
        bias,
        Scoring(scale),
        slicing=slicing,
    )
    return out[..., : keys.expand.v_head_dim]
