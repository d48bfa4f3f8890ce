"""Block-major views of the flat KV caches, which vLLM's KV connectors address: a
layer's ``(2, (num_blocks + 1) * block_size, kv_heads, head_size)`` cache (keys
then values, dummy block last) viewed as ``(num_blocks + 1, 2, block_size,
kv_heads * head_size)``: no copy, a block's keys and values each one contiguous
run (NIXL's two "segments"; vLLM's Gaudi host buffer takes 4-D caches).
Connectors see ``num_blocks + 1`` blocks so segments match; the dummy block is
never handed out. An MLA latent cache is block-major already."""

import dataclasses
from typing import Any

import torch
from vllm.v1.kv_cache_interface import KVCacheConfig


def block_major_view(kv_cache: Any, block_size: int) -> torch.Tensor:
    """``(num_blocks + 1, 2, block_size, kv_heads * head_size)`` over a layer's K/V
    caches, or ``(num_blocks + 1, block_size, latent_size)`` over an MLA cache."""
    if isinstance(kv_cache, torch.Tensor):
        return kv_cache.unflatten(0, (-1, block_size))
    key_cache, value_cache = kv_cache
    keys = key_cache.flatten(1).unflatten(0, (-1, block_size))
    kv_stride = value_cache.storage_offset() - key_cache.storage_offset()
    if value_cache.untyped_storage().data_ptr() != keys.untyped_storage().data_ptr():
        raise ValueError("key and value caches must be views of one allocation")
    return keys.as_strided(
        (keys.shape[0], 2, *keys.shape[1:]),
        (keys.stride(0), kv_stride, *keys.stride()[1:]),
        keys.storage_offset(),
    )


def block_pages(view: torch.Tensor) -> list[torch.Tensor]:
    """Each block's contiguous runs (K and V, or the latent) as int8 bytes
    ``[num_blocks + 1, run_bytes]``, vLLM's offloading convention."""
    runs = view.unbind(1) if view.ndim == 4 else (view,)
    return [run.flatten(1).view(torch.int8) for run in runs]


def connector_kv_cache_config(kv_cache_config: KVCacheConfig) -> KVCacheConfig:
    """The KV cache config connectors are built with: the dummy block counted."""
    return dataclasses.replace(
        kv_cache_config, num_blocks=kv_cache_config.num_blocks + 1
    )
