"""DeepSeek-V3.2's sparse MLA: ``mla.py``'s cache and kernels, each query
attending only the ``index_topk`` keys its layer's indexer chose. Our indexer
replaces vLLM's (whose fp8 CUDA kernels would change which keys win), keeps
its keys in its own flat cache in the model's dtype and masks the rest out."""

from dataclasses import replace
from typing import Any, ClassVar

import torch
from vllm.config import VllmConfig
from vllm.forward_context import get_forward_context
from vllm.model_executor.custom_op import op_registry_oot
from vllm.model_executor.layers.mla import MultiHeadLatentAttentionWrapper
from vllm.v1.kv_cache_interface import MLAAttentionSpec, SparseCacheRole

from vllm_hpu.attention.metadata import HpuAttentionMetadata
from vllm_hpu.attention.mla import HpuMLABackend, HpuMLAImpl, context_rows
from vllm_hpu.ops.paged_attention import DecodeBlocks
from vllm_hpu.ops.prompt_mask import PromptBias, PromptMask
from vllm_hpu.ops.sparse_index import decode_selection, prompt_selection


class HpuSparseMLABackend(HpuMLABackend):
    """The MLA backend for layers whose queries attend their top-k keys."""

    @staticmethod
    def get_impl_cls() -> type["HpuSparseMLAImpl"]:  # type: ignore[override]
        return HpuSparseMLAImpl

    @classmethod
    def is_sparse(cls) -> bool:
        return True


class HpuSparseMLAImpl(HpuMLAImpl):
    """:class:`HpuMLAImpl` under the chosen keys of its layer's indexer."""

    is_sparse: ClassVar[bool] = True
    # vLLM's sparse MLA asks before it runs a prompt as MHA (forward_mha);
    # this impl always does, under the top-k mask (HpuAttentionMetadata.prefill).
    masked_mha_available = False

    def __init__(self, *args: Any, **mla_args: Any) -> None:
        for name in ("topk_indices_buffer", "index_group_builder"):
            mla_args.pop(name, None)  # vLLM's CUDA buffers: the choice comes here
        if mla_args.pop("indexer", None) is None:
            raise ValueError(
                "The HPU sparse MLA backend runs layers with an indexer of "
                "their own only (not IndexCache layers that reuse another "
                "layer's top-k: index_topk_freq, index_topk_pattern)."
            )
        super().__init__(*args, **mla_args)
        # [bs, q, K] (prompt) or [P, block_size] (decode) bool, set by the indexer.
        self.selected: torch.Tensor | None = None

    def record_logical_topk_ready(self) -> None:
        """vLLM's sparse MLA layer signals its CUDA stream here: nothing to do."""

    def _take_selected(self) -> torch.Tensor:
        selected, self.selected = self.selected, None
        assert selected is not None, "the layer's indexer has not run"
        return selected

    def _prompt_bias(self, mask: PromptMask, dtype: torch.dtype) -> PromptBias:
        return PromptBias(mask, dtype, selected=self._take_selected())

    def _decode_blocks(self, attn_metadata: HpuAttentionMetadata) -> DecodeBlocks:
        """Keys the indexer left out score the dtype's most negative value,
        not -inf: a block may lose every key (its statistics stay finite)."""
        blocks = attn_metadata.decode_blocks()
        hidden = torch.finfo(blocks.block_bias.dtype).min
        bias = blocks.block_bias.masked_fill(~self._take_selected(), hidden)
        return replace(blocks, block_bias=bias)


class HpuSparseIndexer(torch.nn.Module):
    """vLLM's ``Indexer`` run in the model's dtype, its choice left with the impl."""

    def __init__(self, indexer: torch.nn.Module, impl: HpuSparseMLAImpl) -> None:
        super().__init__()
        self.indexer = indexer
        self.impl = impl

    def forward(
        self,
        hidden_states: torch.Tensor,
        q_c: torch.Tensor,
        positions: torch.Tensor,
        rotary_emb: torch.nn.Module,
    ) -> None:
        """hidden_states [T, hidden]; q_c [T, q_lora_rank] (normed low-rank query)."""
        query, key, weights = self._project(hidden_states, q_c, positions, rotary_emb)
        indexer: Any = self.indexer
        layers: Any = get_forward_context().attn_metadata
        metadata: HpuAttentionMetadata = layers[indexer.k_cache.prefix]
        cache = indexer.k_cache.kv_cache
        cache.index_copy_(0, metadata.slot_mapping, key.to(cache.dtype))
        index_topk: int = indexer.topk_tokens
        if metadata.is_prompt:
            self.impl.selected = _prompt_choice(
                query, weights, key, cache, metadata, index_topk
            )
        else:
            blocks = metadata.decode_blocks()
            self.impl.selected = decode_selection(
                query, weights, cache, blocks, index_topk
            )

    def _project(
        self,
        hidden_states: torch.Tensor,
        q_c: torch.Tensor,
        positions: torch.Tensor,
        rotary_emb: torch.nn.Module,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(query [T, H, D], key [T, D], weights [T, H] fp32 with the softmax
        and head scales): the rotary part first, rotated half against half."""
        indexer: Any = self.indexer
        heads, head_dim, rope = indexer.n_head, indexer.head_dim, indexer.rope_dim
        query = indexer.wq_b(q_c)[0].view(-1, heads, head_dim)
        key, weights = indexer.wk_weights_proj(hidden_states)[0].split(
            [head_dim, heads], dim=-1
        )
        key = indexer.k_norm(key)
        q_pe, k_pe = rotary_emb(positions, query[..., :rope], key[:, None, :rope])
        query = torch.cat((q_pe.view(-1, heads, rope), query[..., rope:]), dim=-1)
        key = torch.cat((k_pe.view(-1, rope), key[:, rope:]), dim=-1)
        scale = indexer.softmax_scale * indexer.n_head_scale
        return query, key, weights.float() * scale


def _prompt_choice(
    query: torch.Tensor,
    weights: torch.Tensor,
    key: torch.Tensor,
    cache: torch.Tensor,
    metadata: HpuAttentionMetadata,
    index_topk: int,
) -> torch.Tensor:
    mask = metadata.prompt_mask
    assert mask is not None
    batch_size, query_len = mask.batch_size, mask.query_len
    keys = key.view(batch_size, query_len, -1)
    if metadata.block_list is not None:
        keys = torch.cat((context_rows(cache, metadata, batch_size), keys), dim=1)
    visible = mask.allowed(slice(0, query_len), slice(0, mask.num_keys))
    return prompt_selection(
        query.view(batch_size, query_len, *query.shape[1:]),
        weights.view(batch_size, query_len, -1),
        keys,
        visible,
        index_topk,
    )


class HpuMultiHeadLatentAttention(MultiHeadLatentAttentionWrapper):
    """vLLM's MLA layer with :class:`HpuSparseIndexer` as its indexer."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.indexer is not None:
            impl: Any = self.mla_attn.impl
            self.indexer = HpuSparseIndexer(self.indexer, impl)


def index_cache_spec(
    spec: MLAAttentionSpec, vllm_config: VllmConfig
) -> MLAAttentionSpec:
    """The indexer's key cache: vLLM sizes DeepGEMM's fp8 layout; the plugin keeps
    ``index_head_dim`` keys in the model's dtype."""
    if spec.cache_role != SparseCacheRole.INDEXER:
        return spec
    config = vllm_config.model_config
    assert isinstance(config.dtype, torch.dtype), "vLLM resolves the dtype first"
    head_dim = config.hf_text_config.index_head_dim
    return replace(spec, head_size=head_dim, dtype=config.dtype)


def register_sparse_mla() -> None:
    """Construct :class:`HpuMultiHeadLatentAttention` for vLLM's MLA (idempotent)."""
    if MultiHeadLatentAttentionWrapper.__name__ not in op_registry_oot:
        MultiHeadLatentAttentionWrapper.register_oot(HpuMultiHeadLatentAttention)
