"""The KV caches of a model's attention layers: the specs vLLM's cache manager
sizes, the flat caches allocated and bound to each layer, and the geometry the
attention metadata builders read."""

from collections.abc import Mapping
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    MLAAttentionSpec,
)

from vllm_hpu.attention.metadata import CacheGeometry
from vllm_hpu.attention.windows import full_attention_spec, layer_windows
from vllm_hpu.ops.kv_cache import allocate_kv_cache
from vllm_hpu.ops.mla import allocate_latent_cache
from vllm_hpu.worker.capabilities.pooling import encoder_only_kv_cache_spec

Layers = Mapping[str, AttentionLayerBase]


def kv_cache_specs(
    layers: Layers, vllm_config: VllmConfig, block_size: int
) -> dict[str, KVCacheSpec]:
    """One full-attention spec per layer that caches keys (windows included:
    one block table serves every layer); other caches are refused."""
    specs: dict[str, KVCacheSpec] = {}
    for name, layer in layers.items():
        spec = layer.get_kv_cache_spec(vllm_config)
        if spec is None:
            spec = encoder_only_kv_cache_spec(layer, vllm_config)
        if spec is None:
            continue
        if not isinstance(spec, AttentionSpec):
            raise ValueError(
                f"Layer {name} needs a {type(spec).__name__} cache, which the HPU "
                "plugin does not support: only decoder attention models run here."
            )
        specs[name] = full_attention_spec(spec, block_size)
    return specs


def bind_kv_caches(
    layers: Layers, kv_cache_config: KVCacheConfig, torch_device: torch.device
) -> dict[str, Any]:
    """Allocate every layer's cache of ``kv_cache_config.num_blocks`` blocks (plus
    the dummy block) and bind it to the layer."""
    kv_caches = {}
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        assert isinstance(spec, AttentionSpec)
        for name in group.layer_names:
            kv_caches[name] = allocate_layer_cache(
                spec, kv_cache_config.num_blocks, torch_device
            )
            layers[name].bind_kv_cache(kv_caches[name])
    return kv_caches


def unbind_kv_caches(layers: Layers) -> dict[str, Any]:
    """Drop every layer's cache (after profiling, in sleep mode); returns the
    runner's now empty map of caches."""
    for layer in layers.values():
        # 2-D: an MLA layer squeezes dim 1 of what it is given.
        layer.bind_kv_cache(torch.empty(0, 1))
    return {}


def bind_scratch_kv_caches(
    layers: Layers, specs: Mapping[str, KVCacheSpec], torch_device: torch.device
) -> None:
    """One-block caches for a run before the real ones exist (profiling)."""
    for name, spec in specs.items():
        assert isinstance(spec, AttentionSpec)
        layers[name].bind_kv_cache(allocate_layer_cache(spec, 1, torch_device))


def allocate_layer_cache(
    spec: AttentionSpec, num_blocks: int, torch_device: torch.device
) -> Any:
    """A layer's flat caches: (key_cache, value_cache), or for MLA one latent
    cache of kv_lora_rank + qk_rope_head_dim per token (spec.head_size)."""
    if isinstance(spec, MLAAttentionSpec):
        return allocate_latent_cache(
            num_blocks, spec.block_size, spec.head_size, spec.dtype, torch_device
        )
    return allocate_kv_cache(
        num_blocks,
        spec.block_size,
        spec.num_kv_heads,
        spec.head_size,
        spec.dtype,
        torch_device,
    )


def cache_geometry(
    layers: Layers,
    block_size: int,
    num_blocks: int,
    dtype: torch.dtype,
    torch_device: torch.device,
) -> CacheGeometry:
    """The caches' shape as the metadata builders need it, with the distinct
    sliding windows of the layers and whether any layer attends in full."""
    windows = layer_windows(layers.values())
    return CacheGeometry(
        block_size=block_size,
        num_blocks=num_blocks,
        dtype=dtype,
        device=torch_device,
        sliding_windows=tuple(sorted({w for w in windows if w is not None})),
        full_attention=None in windows or not windows,
    )
