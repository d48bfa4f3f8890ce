"""Out-of-tree overrides of vLLM's RMSNorm, RotaryEmbedding, Llama 4's vision
rotary, SiluAndMul and MMEncoderAttention: with custom_ops=["all"] vLLM calls
forward_oot, Gaudi's fused kernel or else forward_native."""

from collections.abc import Callable

import torch
from vllm.model_executor.custom_op import CustomOp, op_registry_oot
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.attention import MMEncoderAttention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
from vllm.model_executor.layers.rotary_embedding.llama4_vision_rope import (
    Llama4VisionRotaryEmbedding,
)

from vllm_hpu import device
from vllm_hpu.ops.encoder_attention import encoder_attention
from vllm_hpu.ops.layer_options import prompt_slicing


def _register_oot(base: type[CustomOp], op_cls: type[CustomOp]) -> None:
    """register_oot asserts on duplicates; plugins are loaded more than once."""
    if base.__name__ not in op_registry_oot:
        base.register_oot(op_cls)


class HpuRMSNorm(RMSNorm):
    def forward_oot(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        kernel = device.fused_rms_norm()
        if kernel is None or self.variance_size_override is not None:
            return self.forward_native(x, residual)
        if residual is not None:
            x = x + residual
            residual = x
        out = kernel.apply(x, self.weight, self.variance_epsilon)  # type: ignore[attr-defined]
        return out if residual is None else (out, residual)


class HpuRotaryEmbedding(RotaryEmbedding):
    def forward_oot(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        kernel = device.fused_rotary_embedding()
        mode = device.fused_rotary_mode(self.is_neox_style)
        if kernel is None or mode is None:
            return self.forward_native(positions, query, key)
        cos, sin = self._cos_sin(positions, query)
        query = self._rotate(kernel, mode, query, cos, sin)
        if key is not None:
            key = self._rotate(kernel, mode, key, cos, sin)
        return query, key

    def _cos_sin(
        self, positions: torch.Tensor, query: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token cos and sin over the whole rotary dim: [num_tokens, 1, rot]."""
        cos_sin = self._match_cos_sin_cache_dtype(query).index_select(
            0, positions.flatten()
        )
        cos, sin = cos_sin.chunk(2, dim=-1)
        if self.is_neox_style:
            cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
        else:
            cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
        return cos.unsqueeze(1), sin.unsqueeze(1)

    def _rotate(
        self,
        kernel: Callable[..., torch.Tensor],
        mode: object,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        shape = x.shape
        x = x.view(cos.shape[0], -1, self.head_size)
        rotated = kernel(x[..., : self.rotary_dim], cos, sin, None, 0, mode)
        return torch.cat((rotated, x[..., self.rotary_dim :]), dim=-1).reshape(shape)


class HpuLlama4VisionRotaryEmbedding(Llama4VisionRotaryEmbedding):
    """Llama 4's 2-D vision rotary in real arithmetic (Gaudi lacks complex tensors):
    ``cos_sin_cache [patches + 1, 1, head_size / 2, 2]``, CLS last."""

    def __init__(
        self,
        head_size: int,
        rotary_dim: int,
        max_position_embeddings: int,
        base: float,
        is_neox_style: bool,
        dtype: torch.dtype,
    ) -> None:
        # ``dtype`` is complex64 (vLLM's cache); ours is real.
        super().__init__(
            head_size,
            rotary_dim,
            max_position_embeddings,
            base,
            is_neox_style,
            torch.float32,
        )

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        """vLLM's complex cache, computed on the host, as (real, imaginary)."""
        with torch.device("cpu"):
            cache = torch.view_as_real(super()._compute_cos_sin_cache())
        return cache.to(torch.get_default_device())

    def forward_oot(  # type: ignore[override]
        self, query: torch.Tensor, key: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """query, key: [tiles, patches + 1, num_heads, head_size]."""
        assert key is not None
        return self._rotate(query), self._rotate(key)

    def _rotate(self, x: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos_sin_cache.unsqueeze(0).unbind(-1)
        x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
        rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
        return rotated.flatten(-2).type_as(x)


class HpuSiluAndMul(SiluAndMul):
    """Gaudi's graph compiler fuses silu(x1) * x2 itself: no kernel to call."""

    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_native(x)


class HpuMMEncoderAttention(MMEncoderAttention):
    """One masked attention over the whole encoder pass (one shape per bucket), for
    [batch, seq, hidden] (CLIP) and [batch, seq, heads, head_size] (Qwen2-VL, with
    cu_seqlens). vLLM's cu_seqlens classmethods stay: with torch SDPA they only
    move cu_seqlens to the device."""

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float | None = None,
        num_kv_heads: int | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__(num_heads, head_size, scale, num_kv_heads, prefix)
        # Long passes in tiles with a mask per tile, never one [P, P] mask.
        self.slicing = prompt_slicing()

    def forward_oot(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: torch.Tensor | None = None,
        sequence_lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # max_seqlen, sequence_lengths size FlashAttention; the mask needs neither.
        batch, seq_len = query.shape[:2]
        flat = query.dim() == 3
        query, key, value = self.view_qkv_to_4d(
            query, key, value, batch, seq_len, key.shape[1]
        )
        out = encoder_attention(query, key, value, self.scale, cu_seqlens, self.slicing)
        return out.reshape(batch, seq_len, -1) if flat else out


_register_oot(RMSNorm, HpuRMSNorm)
_register_oot(RotaryEmbedding, HpuRotaryEmbedding)
_register_oot(Llama4VisionRotaryEmbedding, HpuLlama4VisionRotaryEmbedding)
_register_oot(SiluAndMul, HpuSiluAndMul)
_register_oot(MMEncoderAttention, HpuMMEncoderAttention)
