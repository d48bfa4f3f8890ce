"""The KV caches of a model's attention layers: the specs vLLM's cache manager
sizes, the flat caches allocated and bound to each layer, and the geometry the
attention metadata builders read (one per KV cache group). A hybrid model's
state layers have KV cache groups of their own (``MambaSpec``), whose states
live in worker/capabilities/state_cache.py: here they are passed through and
otherwise skipped."""

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

from vllm_hpu.attention.metadata import CacheGeometry
from vllm_hpu.attention.sparse_mla import index_cache_spec
from vllm_hpu.attention.windows import (
    full_attention_spec,
    hybrid_kv_cache,
    layer_chunks,
    layer_spec,
    layer_windows,
)
from vllm_hpu.ops.kv_cache import allocate_kv_cache
from vllm_hpu.ops.mla_kernels import allocate_latent_cache
from vllm_hpu.worker.capabilities.pooling import encoder_only_kv_cache_spec

Layers = Mapping[str, AttentionLayerBase]


def kv_cache_specs(
    layers: Layers, vllm_config: VllmConfig, block_size: int
) -> dict[str, KVCacheSpec]:
    """One spec per layer that caches keys: full attention, or a sliding window
    under vLLM's hybrid KV cache manager (attention/windows.py); a state layer's
    ``MambaSpec`` as it is; other caches are refused."""
    hybrid = hybrid_kv_cache(vllm_config)
    specs: dict[str, KVCacheSpec] = {}
    for name, layer in layers.items():
        spec = layer.get_kv_cache_spec(vllm_config)
        if spec is None:
            spec = encoder_only_kv_cache_spec(layer, vllm_config)
        if spec is None:
            continue
        if isinstance(spec, MambaSpec):
            specs[name] = spec
            continue
        if not isinstance(spec, AttentionSpec):
            raise ValueError(
                f"Layer {name} needs a {type(spec).__name__} cache, which the HPU "
                "plugin does not support: only decoder attention models run here."
            )
        if isinstance(spec, MLAAttentionSpec):
            spec = index_cache_spec(spec, vllm_config)
        specs[name] = layer_spec(spec, block_size, hybrid)
    return specs


def bind_kv_caches(
    layers: Layers, kv_cache_config: KVCacheConfig, torch_device: torch.device
) -> dict[str, Any]:
    """Allocate the caches of ``kv_cache_config.num_blocks`` blocks (plus the
    dummy block) and bind each layer its own.

    KV cache groups share memory as vLLM's config lays it out: the i-th layer of
    every group uses the same cache (a block id belongs to one group at a time),
    so groups of windowed and full layers cost the memory of one group.
    """
    kv_caches = {}
    shared: dict[tuple[int, AttentionSpec], Any] = {}
    for group in attention_groups(kv_cache_config):
        for index, name in enumerate(group.layer_names):
            spec = group_layer_spec(group, name)
            # Caches are shaped by the page, not by which tokens a layer attends.
            shape = full_attention_spec(spec, spec.block_size)
            if (index, shape) not in shared:
                shared[index, shape] = allocate_layer_cache(
                    spec, kv_cache_config.num_blocks, torch_device
                )
            kv_caches[name] = shared[index, shape]
            layers[name].bind_kv_cache(kv_caches[name])
    return kv_caches


def group_layer_spec(group: KVCacheGroupSpec, name: str) -> AttentionSpec:
    """A layer's own spec in its group: one group holds layers of different
    head sizes (UniformTypeKVCacheSpecs) where the hybrid manager is off."""
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        spec = spec.kv_cache_specs[name]
    assert isinstance(spec, AttentionSpec), f"{name}: {spec}"
    return spec


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
        if isinstance(spec, MambaSpec):
            continue
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
    sliding windows and chunk sizes of ``layers`` and whether any of them
    attends in full."""
    windows = layer_windows(layers.values())
    chunks = layer_chunks(layers.values())
    full = [w is None and c is None for w, c in zip(windows, chunks, strict=True)]
    return CacheGeometry(
        block_size=block_size,
        num_blocks=num_blocks,
        dtype=dtype,
        device=torch_device,
        sliding_windows=tuple(sorted({w for w in windows if w is not None})),
        full_attention=any(full) or not windows,
        attention_chunks=tuple(sorted({c for c in chunks if c is not None})),
    )


def group_cache_geometry(
    layers: Layers,
    kv_cache_config: KVCacheConfig,
    dtype: torch.dtype,
    torch_device: torch.device,
) -> CacheGeometry:
    """The geometry of all (attention) ``layers``, with one of its own per KV
    cache group when there are several (their block tables differ); a state
    group's is a placeholder that keeps the indices of the requests' block
    tables (``holds_states``: no metadata is built for it)."""
    block_size = check_group_block_sizes(kv_cache_config)
    num_blocks = kv_cache_config.num_blocks
    whole = cache_geometry(layers, block_size, num_blocks, dtype, torch_device)
    groups = kv_cache_config.kv_cache_groups
    if len(groups) == 1:
        return whole
    per_group = tuple(
        replace(whole, holds_states=True)
        if isinstance(group.kv_cache_spec, MambaSpec)
        else cache_geometry(
            {name: layers[name] for name in group.layer_names},
            block_size,
            num_blocks,
            dtype,
            torch_device,
        )
        for group in groups
    )
    return replace(whole, groups=per_group)


def check_group_block_sizes(kv_cache_config: KVCacheConfig) -> int:
    """The one block size of every attention KV cache group: the runner pads
    and buckets by a single block size (a state group's block spans a request)."""
    sizes = {g.kv_cache_spec.block_size for g in attention_groups(kv_cache_config)}
    if len(sizes) != 1:
        raise ValueError(
            f"KV cache groups of block sizes {sorted(sizes)}: the HPU runner "
            "needs one block size for every layer; start vLLM with "
            "--disable-hybrid-kv-cache-manager."
        )
    return sizes.pop()


def layer_groups(kv_cache_config: KVCacheConfig) -> dict[str, int]:
    """Each attention layer's KV cache group (the index of its block table)."""
    return {
        name: index
        for index, group in enumerate(kv_cache_config.kv_cache_groups)
        if not isinstance(group.kv_cache_spec, MambaSpec)
        for name in group.layer_names
    }


def attention_groups(kv_cache_config: KVCacheConfig) -> list[KVCacheGroupSpec]:
    """The KV cache groups of attention layers (not a hybrid's state layers)."""
    return [
        group
        for group in kv_cache_config.kv_cache_groups
        if not isinstance(group.kv_cache_spec, MambaSpec)
    ]


def reachable_decode_blocks(
    kv_cache_config: KVCacheConfig, max_num_seqs: int, max_model_len: int
) -> int:
    """The most blocks a decode batch's block tables span (decode buckets count
    a row's whole table): the cache's blocks where some group holds every block
    of its table, else rows at ``max_model_len`` (groups that only window free
    the blocks behind their windows, so their tables outgrow the cache)."""
    groups = attention_groups(kv_cache_config)
    if all(isinstance(g.kv_cache_spec, SlidingWindowSpec) for g in groups):
        block_size = groups[0].kv_cache_spec.block_size
        return max_num_seqs * -(-max_model_len // block_size)
    return kv_cache_config.num_blocks
