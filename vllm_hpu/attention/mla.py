"""HpuMLABackend: vLLM's MLAAttention layers (DeepSeek-V2/V3) on a flat latent cache.

vLLM's ``MLAAttention.forward_impl`` absorbs W_UK and W_UV for decode itself;
our impl writes the latent cache, runs prompt tokens as MHA over latents
expanded through our own split of kv_b_proj, cached context in latent space
and decode tokens as flat MQA (``ops/mla_kernels.py``)."""

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from vllm.model_executor.layers.attention.mla_attention import split_kv_b_proj
from vllm.v1.attention.backend import AttentionLayer, AttentionType, MLAAttentionImpl
from vllm.v1.attention.backends.mla.prefill.base import MLAPrefillBackend

from vllm_hpu import device
from vllm_hpu.attention.backend import (
    HpuAttentionBackend,
    cache_problems,
    raise_first_problem,
)
from vllm_hpu.attention.metadata import HpuAttentionMetadata
from vllm_hpu.envs import get_envs
from vllm_hpu.ops.layer_options import decode_block_slice, prompt_slicing
from vllm_hpu.ops.mla_kernels import (
    LatentContext,
    LatentExpansion,
    LatentKeys,
    gather_latent_context,
    latent_cache_shape,
    latent_chunk_attention,
    latent_decode_attention,
    latent_prompt_attention,
    write_latent_to_cache,
)
from vllm_hpu.ops.paged_attention import DecodeBlocks
from vllm_hpu.ops.prompt_mask import PromptBias, PromptMask

if TYPE_CHECKING:
    from vllm.config.cache import CacheDType
    from vllm.v1.attention.selector import AttentionSelectorConfig


class HpuMLABackend(HpuAttentionBackend):
    """Block sizes, dtypes and the name (CUSTOM) of :class:`HpuAttentionBackend`;
    the platform hands it out by class path for layers with ``use_mla``."""

    # The latent cache has no fp8_inc path (start-up refuses it, naming auto).
    supported_kv_cache_dtypes: ClassVar[list["CacheDType"]] = ["auto"]

    @staticmethod
    def get_impl_cls() -> type["HpuMLAImpl"]:  # type: ignore[override]
        return HpuMLAImpl

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []  # any kv_lora_rank + qk_rope_head_dim: the ops take every size

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        cache_dtype_str: str = "auto",
    ) -> tuple[int, ...]:
        """One latent row per token; one extra block is the padding dummy."""
        return latent_cache_shape(num_blocks, block_size, head_size)


def check_mla_supported(attn_selector_config: "AttentionSelectorConfig") -> None:
    """Raise a ValueError naming what the MLA backend lacks and how to avoid it."""
    config = attn_selector_config
    problems = [
        (
            config.has_sliding_window,
            "sliding-window MLA",
            "use a model without a sliding window",
        ),
        (
            get_envs().compile_fullgraph,
            "VLLM_T_COMPILE_FULLGRAPH=1 (vLLM's MLA layer multiplies into a "
            "transposed out= tensor, which splits the compiled graph)",
            "unset VLLM_T_COMPILE_FULLGRAPH",
        ),
        *cache_problems(config, HpuMLABackend),
    ]
    raise_first_problem("MLA", problems)


class HpuMLAPrefillBackend(MLAPrefillBackend):
    """What vLLM's MLAAttention asks the platform for: its prefill kernel is only
    called by vLLM's own ``MLACommonImpl.forward_mha``, which we replace, so this
    names the path prompts take and refuses to be driven any other way."""

    supported_dtypes = HpuAttentionBackend.supported_dtypes

    @staticmethod
    def get_name() -> str:
        return "HPU_PROMPT_ATTENTION"

    def run_prefill_new_tokens(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("HpuMLAImpl.forward_mha runs MLA prompts itself")

    def run_prefill_context_chunk(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("HpuMLAImpl.forward_mha runs MLA prompts itself")


class HpuMLAImpl(MLAAttentionImpl[HpuAttentionMetadata]):
    """Latent cache writes, prompt MHA, context in latent space, decode MQA."""

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None,
        attn_type: str,
        kv_sharing_target_layer_name: str | None,
        **mla_args: Any,
    ) -> None:
        _refuse_unsupported(
            alibi_slopes=alibi_slopes,
            sliding_window=sliding_window,
            logits_soft_cap=logits_soft_cap,
            kv_sharing_target_layer_name=kv_sharing_target_layer_name,
            indexer=mla_args.pop("indexer", None),
            attn_type=None if attn_type == AttentionType.DECODER else attn_type,
        )
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_lora_rank: int = mla_args["kv_lora_rank"]
        self.kv_b_proj = mla_args["kv_b_proj"]
        self.expand = LatentExpansion(
            kv_b_proj=self._kv_b_proj,
            num_heads=num_heads,
            kv_lora_rank=self.kv_lora_rank,
            qk_nope_head_dim=mla_args["qk_nope_head_dim"],
            v_head_dim=mla_args["v_head_dim"],
        )
        self.w_uk: torch.Tensor | None = None  # [L, N, P], once weights load
        self.w_uv: torch.Tensor | None = None  # [L, N, V]
        self.slicing = prompt_slicing()
        self.decode_block_slice = decode_block_slice()

    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        """W_UK and W_UV for prompt passes, split from kv_b_proj as vLLM splits its own
        (views of an unquantized weight, else a dequantized copy), on the device even
        when the weights loaded on the host (INC's QUANTIZE)."""
        split = split_kv_b_proj(
            self.kv_b_proj,
            act_dtype,
            self.kv_lora_rank,
            self.num_heads,
            self.expand.qk_nope_head_dim,
            self.expand.v_head_dim,
        )
        self.w_uk, self.w_uv = (w.to(device.device_type()) for w in split)

    def _kv_b_proj(self, kv_c: torch.Tensor) -> torch.Tensor:
        """kv_b_proj in latent space, through W_UK and W_UV, so a token's keys and
        values are the same in every kind of pass. kv_c: [T, L] -> [T, N * (P + V)]."""
        assert self.w_uk is not None and self.w_uv is not None, (
            "process_weights_after_loading has not run"
        )
        k_nope = torch.einsum("tl,lnp->tnp", kv_c, self.w_uk)
        value = torch.einsum("tl,lnv->tnv", kv_c, self.w_uv)
        return torch.cat((k_nope, value), dim=-1).flatten(1)

    def do_kv_cache_update(
        self,
        kv_c_normed: torch.Tensor,
        k_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_cache_dtype: str,
        k_scale: torch.Tensor,
        skip_scale: bool = False,  # vLLM 0.33 passes it; the latent is not scaled
    ) -> None:
        write_latent_to_cache(kv_cache, slot_mapping, kv_c_normed, k_pe)

    def forward_mha(
        self,
        q: torch.Tensor,
        kv_c_normed: torch.Tensor,
        k_pe: torch.Tensor,
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: HpuAttentionMetadata,
        k_scale: torch.Tensor,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
    ) -> None:
        """A prompt pass: q [bs * q, N, P + R]; output [bs * q, N * V]."""
        if output_scale is not None:
            raise NotImplementedError("fused output quantization is not supported")
        mask = attn_metadata.prompt_mask
        assert mask is not None
        batch_size, query_len = mask.batch_size, mask.query_len
        latent = torch.cat((kv_c_normed, k_pe.flatten(1)), dim=-1)
        keys = LatentKeys(
            latent.view(batch_size, query_len, -1),
            self.expand,
            max(q.shape[-1], self.expand.v_head_dim),
        )
        query = q.view(batch_size, query_len, *q.shape[1:])
        bias = self._prompt_bias(mask, q.dtype)
        if attn_metadata.block_list is None:
            out = latent_prompt_attention(query, keys, bias, self.scale, self.slicing)
        else:
            context = self._context(kv_c_and_k_pe_cache, attn_metadata, batch_size)
            out = latent_chunk_attention(
                query, context, keys, bias, self.scale, self.slicing
            )
        output.copy_(out.reshape(output.shape))

    def _prompt_bias(self, mask: PromptMask, dtype: torch.dtype) -> PromptBias:
        return PromptBias(mask, dtype)

    def _context(
        self, cache: torch.Tensor, attn_metadata: HpuAttentionMetadata, batch_size: int
    ) -> LatentContext:
        """The pass's cached latents with this layer's W_UK and W_UV."""
        assert self.w_uk is not None and self.w_uv is not None, (
            "process_weights_after_loading has not run"
        )
        latent = context_rows(cache, attn_metadata, batch_size)
        return LatentContext(latent, self.w_uk, self.w_uv)

    def forward_mqa(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: HpuAttentionMetadata,
        layer: AttentionLayer,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A decode pass: q is (q_nope absorbed into latent space [bs, N, L],
        q_pe [bs, N, R]); returns the latent output [bs, N, L] and no LSE."""
        query = torch.cat(q, dim=-1) if isinstance(q, tuple) else q
        out = latent_decode_attention(
            query,
            kv_c_and_k_pe_cache,
            self._decode_blocks(attn_metadata),
            self.scale,
            self.kv_lora_rank,
            self.decode_block_slice,
        )
        return out, None

    def _decode_blocks(self, attn_metadata: HpuAttentionMetadata) -> DecodeBlocks:
        return attn_metadata.decode_blocks()


def context_rows(
    cache: torch.Tensor, attn_metadata: HpuAttentionMetadata, batch_size: int
) -> torch.Tensor:
    """A prompt pass's cached context rows of a flat cache [slots, X] (the
    latents, or DeepSeek-V3.2's indexer keys): [bs, C * B, X]."""
    assert attn_metadata.block_list is not None and attn_metadata.prompt_mask
    # Shapes, not values: C = blocks per row, B = past keys per block.
    num_context_blocks = attn_metadata.block_list.shape[0] // batch_size
    block_size = attn_metadata.prompt_mask.past_len // num_context_blocks
    return gather_latent_context(
        cache, attn_metadata.block_list, batch_size, block_size
    )


def _refuse_unsupported(**settings: object) -> None:
    for name, value in settings.items():
        if value is not None:
            raise ValueError(
                f"The HPU MLA backend does not support {name}={value!r}; "
                "use a model without it."
            )
