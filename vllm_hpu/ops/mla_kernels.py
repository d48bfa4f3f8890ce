"""Multi-head latent attention (DeepSeek-V2/V3) on one flat latent cache per layer,
a row ``[kv_c (kv_lora_rank) ; k_pe (qk_rope_head_dim)]`` per token. Decode and
a prompt's cached context attend in latent space (MQA: one head, the latent is
also the value); a prompt's own tokens expand through ``kv_b_proj`` per head."""

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
from vllm_hpu.ops.prompt_attention import prompt_attention, tile_attention
from vllm_hpu.ops.prompt_mask import PromptBias
from vllm_hpu.ops.score_mods import Scoring
from vllm_hpu.ops.sliced_attention import (
    NO_SLICING,
    PromptSlicing,
    TileGrid,
    attend_tiles,
    merge_tiles,
)


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
    """Flat decode attention in latent space: query [bs, heads, L + R] (W_UK
    absorbed), cache [slots, L + R] -> [bs, heads, L], before W_UV. The value is
    the key's latent part, so blocks are gathered once."""
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

    def keys_and_values(
        self, latent: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """latent [..., L + R] -> key [..., N, P + R], value [..., N, V]."""
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
    """A pass's own tokens as latents [bs, q, L + R], expanded per head only per key
    tile, zero-padded to one ``head_size``; context stays latent."""

    latent: torch.Tensor
    expand: LatentExpansion
    head_size: int

    @property
    def past_len(self) -> int:
        return 0

    @property
    def num_keys(self) -> int:
        return self.latent.shape[1]

    def read(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._expanded(self.latent[:, start:end])

    def whole(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._expanded(self.latent)

    def _expanded(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        key, value = self.expand.keys_and_values(latent)
        return _pad_head(key, self.head_size), _pad_head(value, self.head_size)


@dataclass(frozen=True)
class LatentContext:
    """A prompt pass's cached context [bs, C * B, L + R], attended in latent space as
    decode does, so projection work follows the pass's queries, not the context."""

    latent: torch.Tensor
    w_uk: torch.Tensor
    w_uv: torch.Tensor

    @property
    def past_len(self) -> int:
        return self.latent.shape[1]

    def absorb(self, query: torch.Tensor) -> torch.Tensor:
        """query [..., N, P + R] -> [..., N, L + R] (the rope part as it is)."""
        q_nope, q_pe = query.split(
            [self.w_uk.shape[-1], query.shape[-1] - self.w_uk.shape[-1]], dim=-1
        )
        q_latent = torch.einsum("...np,lnp->...nl", q_nope, self.w_uk.to(query.dtype))
        return torch.cat((q_latent, q_pe), dim=-1)

    def read(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One head of keys [bs, n, 1, L + R]; the value is the key's latent."""
        key = self.latent[:, start:end].unsqueeze(2)
        return key, key[..., : self.w_uk.shape[0]]

    def project(self, out: torch.Tensor) -> torch.Tensor:
        """A latent output [..., N, L] -> [..., N, V] in fp32."""
        out = torch.einsum("...nl,lnv->...nv", out.to(self.w_uv.dtype), self.w_uv)
        return out.float()


def latent_prompt_attention(
    query: torch.Tensor,
    keys: LatentKeys,
    bias: PromptBias,
    scale: float,
    slicing: PromptSlicing = NO_SLICING,
) -> torch.Tensor:
    """Prompt attention of a pass without cached context over its expanded latents.
    query [bs, q, N, P + R]; bias over [bs, q] x [bs, q] -> [bs, q, N, V]."""
    out = prompt_attention(
        _pad_head(query, keys.head_size),
        keys,
        bias,
        Scoring(scale),
        slicing=slicing,
    )
    return out[..., : keys.expand.v_head_dim]


def latent_chunk_attention(
    query: torch.Tensor,
    context: LatentContext,
    keys: LatentKeys,
    bias: PromptBias,
    scale: float,
    slicing: PromptSlicing = NO_SLICING,
) -> torch.Tensor:
    """Prompt attention with cached context: query [bs, q, N, P + R] -> [bs, q, N, V];
    context in latent space, own tokens expanded, merged by log-sum-exp."""
    past_len = context.past_len
    num_keys = past_len + keys.num_keys
    chunk = slicing.chunk_size if slicing.applies(num_keys) else num_keys
    grid = TileGrid(query.shape[1], past_len, chunk, bias.causal)
    latent_query = context.absorb(query)
    padded_query = _pad_head(query, keys.head_size)
    # 576-wide latent heads are outside the fused kernel's head sizes.
    in_latent = tile_attention(Scoring(scale, use_fused=False), PLAIN)
    expanded = tile_attention(Scoring(scale), PLAIN)

    def read_own(start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        return keys.read(start - past_len, end - past_len)

    outputs = []
    for queries in grid.query_tiles():
        tiles = grid.key_tiles(queries)
        past = [t for t in tiles if t.stop <= past_len]
        own = [t for t in tiles if t.start >= past_len]
        ctx_out, ctx_lse = attend_tiles(
            in_latent, latent_query[:, queries], context.read, bias.tile, queries, past
        )
        own_out, own_lse = attend_tiles(
            expanded, padded_query[:, queries], read_own, bias.tile, queries, own
        )
        out, _ = merge_tiles(
            (context.project(ctx_out), ctx_lse),
            (own_out[..., : keys.expand.v_head_dim], own_lse),
        )
        outputs.append(out.to(query.dtype))
    return torch.cat(outputs, dim=1)
