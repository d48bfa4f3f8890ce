"""HpuAttentionBackend: vLLM's attention layer running our ops on the flat KV cache.

Registered as AttentionBackendEnum.CUSTOM at import (idempotent: a dict entry).
"""

from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionLayer,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

from vllm_hpu import device
from vllm_hpu.attention.inc_modules import (
    Matmul,
    ModuleFusedSDPA,
    Softmax,
    VLLMKVCache,
)
from vllm_hpu.attention.metadata import HpuAttentionMetadata
from vllm_hpu.ops.attention_kernels import AttentionKernels
from vllm_hpu.ops.kv_cache import kv_cache_shape, read_slots
from vllm_hpu.ops.layer_options import (
    binding_window,
    decode_block_slice,
    prompt_slicing,
    use_fused,
)
from vllm_hpu.ops.paged_attention import (
    DecodeBlocks,
    blocks_with_alibi,
    paged_attention,
)
from vllm_hpu.ops.prompt_attention import PassKeys, gather_context, prompt_attention
from vllm_hpu.ops.prompt_mask import PromptBias, PromptMask, padded_rows_mask
from vllm_hpu.ops.score_mods import Scoring

if TYPE_CHECKING:
    from vllm.config.cache import CacheDType
    from vllm.v1.attention.selector import AttentionSelectorConfig

BLOCK_SIZE_MULTIPLE = 16
PREFERRED_BLOCK_SIZE = 128  # platform.DEFAULT_BLOCK_SIZE: Gaudi's MME tile
# The flat kernels are plain torch: any head size runs; the fused prompt kernel
# takes fewer (ops.prompt_attention.FUSED_SDPA_HEAD_SIZES), the rest run plain.
# 512: Gemma 4's global layers.
SUPPORTED_HEAD_SIZES = list(range(32, 513, 8))
# Encoder-only: decoder models run bidirectionally for pooling (is_causal=False).
SUPPORTED_ATTN_TYPES = (AttentionType.DECODER, AttentionType.ENCODER_ONLY)


class HpuAttentionBackend(AttentionBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [
        torch.bfloat16,
        torch.float16,
        torch.float32,
    ]
    # fp8_inc: e4m3 (the platform maps fp8 and fp8_e4m3 to it; ops.kv_cache).
    supported_kv_cache_dtypes: ClassVar[list["CacheDType"]] = ["auto", "fp8_inc"]
    forward_includes_kv_cache_update: bool = True

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"  # the enum member out-of-tree backends register under

    @staticmethod
    def get_impl_cls() -> type["HpuAttentionImpl"]:
        return HpuAttentionImpl

    @staticmethod
    def get_builder_cls() -> type["HpuAttentionMetadataBuilder"]:
        return HpuAttentionMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(
        kv_cache_spec: Any = None,
    ) -> list[int | MultipleOf]:
        return [MultipleOf(BLOCK_SIZE_MULTIPLE)]

    @classmethod
    def get_preferred_block_size(cls, default_block_size: int) -> int:
        # vLLM passes its own default (16) after model load and adopts our answer
        # unless the user chose --block-size: always answer the platform's size.
        return PREFERRED_BLOCK_SIZE

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return SUPPORTED_HEAD_SIZES

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        cache_dtype_str: str = "auto",
    ) -> tuple[int, ...]:
        """(key, value) stacked; one extra block is the padding dummy."""
        return kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size)


def check_supported(attn_selector_config: "AttentionSelectorConfig") -> None:
    """Raise a ValueError naming what this backend lacks and how to avoid it."""
    config = attn_selector_config
    problems = [
        (config.use_sparse, "sparse attention", "use a dense-attention model"),
        (
            config.attn_type not in SUPPORTED_ATTN_TYPES,
            f"{AttentionType(config.attn_type).value} attention",
            "use a decoder-only model",
        ),
        (
            config.use_non_causal,
            "non-causal attention mixed with causal attention in one batch",
            "use a model whose layers are all causal or all encoder-only",
        ),
        (
            not HpuAttentionBackend.supports_head_size(config.head_size),
            f"head size {config.head_size}",
            "use a model whose head size is a multiple of 8 from 32 to 512",
        ),
        *cache_problems(config, HpuAttentionBackend),
    ]
    raise_first_problem("attention", problems)


Problem = tuple[bool, str, str]  # (unsupported, what, fix)


def cache_problems(
    config: "AttentionSelectorConfig", backend: type[AttentionBackend]
) -> list[Problem]:
    """What every HPU backend's KV cache refuses alike."""
    accepted = backend.supported_kv_cache_dtypes
    return [
        (
            config.kv_cache_dtype not in (None, *accepted),
            f"kv_cache_dtype={config.kv_cache_dtype}",
            "use --kv-cache-dtype " + " or ".join(accepted),
        ),
        (
            not backend.supports_block_size(config.block_size),
            f"block size {config.block_size}",
            f"use a --block-size that is a multiple of {BLOCK_SIZE_MULTIPLE}",
        ),
    ]


def raise_first_problem(backend: str, problems: list[Problem]) -> None:
    """A ValueError naming the first thing the backend lacks and how to avoid it."""
    for unsupported, what, fix in problems:
        if unsupported:
            raise ValueError(
                f"The HPU {backend} backend does not support {what}: {fix}."
            )


class HpuAttentionMetadataBuilder(AttentionMetadataBuilder[HpuAttentionMetadata]):
    """Our model runner builds HpuAttentionMetadata itself (attention.metadata)."""

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:  # type: ignore[no-untyped-def]
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> HpuAttentionMetadata:
        raise NotImplementedError(
            "HPU attention metadata is built by the HPU model runner "
            "(vllm_hpu.attention.metadata), not from CommonAttentionMetadata."
        )


class HpuAttentionImpl(AttentionImpl[HpuAttentionMetadata], torch.nn.Module):
    """Writes the step's keys and values into the cache, then attends: prompts
    with :func:`prompt_attention`, decodes with flat :func:`paged_attention`.

    A module whose submodules are the steps Intel Neural Compressor quantizes,
    named as on Gaudi (``attention/inc_modules.py``)."""

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
        **unsupported: Any,
    ) -> None:
        for name, value in unsupported.items():
            if value is not None:
                raise ValueError(
                    f"The HPU attention backend does not support {name}; "
                    "use a model without it."
                )
        torch.nn.Module.__init__(self)
        self.num_heads = num_heads
        self.head_size = head_size
        self.num_kv_heads = num_kv_heads or num_heads
        self.scale = float(scale)
        self.sliding_window = binding_window(sliding_window)
        self.alibi_slopes: torch.Tensor | None = None
        if alibi_slopes is not None:
            self.alibi_slopes = torch.tensor(alibi_slopes, dtype=torch.float32)
        self.scoring = Scoring(
            self.scale,
            logits_soft_cap,
            use_fused=use_fused(head_size, logits_soft_cap, alibi_slopes),
            sinks=_checked_sinks(sinks, num_heads),
        )
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.matmul_qk = Matmul()
        self.softmax = Softmax()
        self.matmul_av = Matmul()
        self.k_cache = VLLMKVCache()
        self.v_cache = VLLMKVCache()
        fused = device.fused_sdpa() if self.scoring.use_fused else None
        self.fused_scaled_dot_product_attention = (
            None if fused is None else ModuleFusedSDPA(fused)
        )
        self.slicing = prompt_slicing()
        self.decode_block_slice = decode_block_slice()
        # Whether image tokens' spans apply here (worker/passes/seqs.py).
        self.image_spans = True

    def _kernels(self) -> AttentionKernels:
        """The submodules as the ops call them, read at each call: INC replaces
        them in place when it prepares or converts the model."""
        fused = self.fused_scaled_dot_product_attention
        return AttentionKernels(
            matmul_qk=self.matmul_qk,
            softmax=self.softmax,
            matmul_av=self.matmul_av,
            fetch_keys=self.k_cache.fetch_from_cache,
            fetch_values=self.v_cache.fetch_from_cache,
            fused_sdpa=fused,
        )

    def forward(
        self,
        layer: AttentionLayer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: Any,
        attn_metadata: HpuAttentionMetadata,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """query: [num_tokens, num_heads, head_size]; key, value: [num_tokens,
        num_kv_heads, head_size]; kv_cache: (key_cache, value_cache) bound by the
        worker. The result goes into ``output`` [num_tokens, num_heads, head_size]."""
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("fused output quantization is not supported")
        if attn_metadata is None:  # vLLM's dummy/profiling passes without metadata
            return output.zero_()
        if self.attn_type == AttentionType.ENCODER_ONLY:
            result = self._bidirectional(query, key, value, attn_metadata)
            return output.copy_(result.reshape(output.shape))
        key_cache, value_cache = kv_cache
        if self.kv_sharing_target_layer_name is None:
            self.k_cache(key, key_cache, attn_metadata.slot_mapping)
            self.v_cache(value, value_cache, attn_metadata.slot_mapping)
        elif attn_metadata.is_prompt:
            # The layer whose cache this one shares wrote the pass's keys.
            key, value = (
                read_slots(cache, attn_metadata.slot_mapping, query.dtype)
                for cache in kv_cache
            )
        kernels = self._kernels()
        chunk = attention_chunk(layer)
        if attn_metadata.is_prompt:
            result = self._prompt(
                query, key, value, kv_cache, attn_metadata, kernels, chunk
            )
        else:
            blocks = self._decode_blocks(attn_metadata, chunk)
            result = paged_attention(
                query,
                key_cache,
                value_cache,
                blocks,
                self.scoring,
                kernels,
                self.decode_block_slice,
            )
        output.copy_(result.reshape(output.shape))
        return output

    def _bidirectional(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_metadata: HpuAttentionMetadata,
    ) -> torch.Tensor:
        """Encoder-only attention over whole prompts: vLLM turns chunked prefill
        and prefix caching off for it and pooling models never decode, so there
        is no context, and the KV cache is neither written nor read."""
        query_lens = attn_metadata.query_lens
        assert attn_metadata.is_prompt and query_lens is not None
        assert attn_metadata.block_list is None, "encoder-only prompts have no context"
        batch_size = query_lens.shape[0]
        query_len = query.shape[0] // batch_size
        mask = padded_rows_mask(
            torch.zeros_like(query_lens), query_lens, query_len, 0, causal=False
        )
        return prompt_attention(
            query.view(batch_size, query_len, *query.shape[1:]),
            PassKeys(
                key.view(batch_size, query_len, *key.shape[1:]),
                value.view(batch_size, query_len, *value.shape[1:]),
            ),
            self._bias(mask, query.dtype),
            self.scoring,
            self._kernels(),
            self.slicing,
        )

    def _prompt(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        attn_metadata: HpuAttentionMetadata,
        kernels: AttentionKernels,
        chunk: int | None = None,
    ) -> torch.Tensor:
        """Unflatten the padded [bs * q] tokens and attend, with context if any;
        ``chunk``: the layer's attention chunk size (Llama 4) or None."""
        mask = attn_metadata.prompt_mask
        assert mask is not None
        if not self.image_spans:
            mask = replace(mask, query_span_end=None)
        batch_size, query_len = mask.batch_size, mask.query_len
        past_kv = None
        if attn_metadata.block_list is not None:
            # Shapes, not values: C = blocks per row, B = past keys per block.
            num_context_blocks = attn_metadata.block_list.shape[0] // batch_size
            block_size = mask.past_len // num_context_blocks
            key_cache, value_cache = kv_cache
            past_kv = gather_context(
                key_cache,
                value_cache,
                attn_metadata.block_list,
                batch_size,
                block_size,
                kernels,
            )
        return prompt_attention(
            query.view(batch_size, query_len, *query.shape[1:]),
            PassKeys(
                key.view(batch_size, query_len, *key.shape[1:]),
                value.view(batch_size, query_len, *value.shape[1:]),
                past_kv,
            ),
            self._bias(mask, query.dtype, chunk),
            self.scoring,
            kernels,
            self.slicing,
        )

    def _slopes(self, on: torch.device) -> torch.Tensor:
        assert self.alibi_slopes is not None
        if self.alibi_slopes.device != on:  # once: the slopes follow the model
            self.alibi_slopes = self.alibi_slopes.to(on)
        return self.alibi_slopes

    def _bias(
        self, mask: PromptMask, dtype: torch.dtype, chunk: int | None = None
    ) -> PromptBias:
        """This layer's score bias over the pass: its window or chunk, its ALiBi
        slopes."""
        slopes = None
        if self.alibi_slopes is not None:
            slopes = self._slopes(mask.key_owner.device)
        return PromptBias(mask, dtype, self.sliding_window, slopes, chunk)

    def _decode_blocks(
        self, attn_metadata: HpuAttentionMetadata, chunk: int | None = None
    ) -> DecodeBlocks:
        """This layer's flat blocks (its window's or chunk's), with ALiBi in the
        bias."""
        blocks = attn_metadata.decode_blocks(self.sliding_window, chunk)
        if self.alibi_slopes is None:
            return blocks
        slopes = self._slopes(blocks.block_bias.device)
        return blocks_with_alibi(blocks, slopes)


def attention_chunk(layer: AttentionLayer) -> int | None:
    """The chunk size of a chunked local attention layer (Llama 4), else None:
    vLLM sets it on the layer (ChunkedLocalAttention), never on its impl."""
    return getattr(layer, "attention_chunk_size", None)


def _checked_sinks(sinks: torch.Tensor | None, num_heads: int) -> torch.Tensor | None:
    """The layer's attention sinks ([num_heads], the model's parameter, loaded
    later: kept by reference), checked against its heads."""
    if sinks is not None and sinks.shape != (num_heads,):
        raise ValueError(
            f"attention sinks of shape {tuple(sinks.shape)} for {num_heads} heads: "
            "the HPU attention backend takes one sink per head"
        )
    return sinks


def register() -> None:
    """Make AttentionBackendEnum.CUSTOM resolve to us (a dict entry: idempotent)."""
    register_backend(AttentionBackendEnum.CUSTOM, f"{__name__}.HpuAttentionBackend")


register()
