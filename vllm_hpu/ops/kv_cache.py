"""The flat, slot-major KV cache of one layer, with a dummy block for padding.

Each of key_cache and value_cache is ``[(num_blocks + 1) * block_size,
num_kv_heads, head_size]``; block ``num_blocks`` takes every padding write, so no
slot or block index is ever negative (``index_copy_`` with -1 fails on the CPU).
An fp8_inc cache holds e4m3 values, written through a byte view (``index_copy_``
does not take fp8 on the CPU) and upcast by every reader before a matmul.
"""

import torch

from vllm_hpu import device


def kv_cache_shape(
    num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
) -> tuple[int, int, int, int]:
    """``(2, (num_blocks + 1) * block_size, num_kv_heads, head_size)``: key, value."""
    return (2, (num_blocks + 1) * block_size, num_kv_heads, head_size)


def allocate_kv_cache(
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeroed ``(key_cache, value_cache)``, two views of one allocation."""
    shape = kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size)
    kv_cache = torch.zeros(shape, dtype=dtype, device=device)
    return kv_cache[0], kv_cache[1]


FP8_DTYPES = (torch.float8_e4m3fn,)
FP8_LIMIT = device.fp8_max()  # the card's e4m3 range (240 on Gaudi2)


def to_cache_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` as the cache stores it; fp8 saturates at its largest finite value
    (a plain cast would turn an out-of-range value into NaN). The per-tensor
    scale is 1.0, as the reference's fp8_inc cache without calibration; a value
    INC already quantized with its scale is stored as it is."""
    if x.dtype == dtype or dtype not in FP8_DTYPES:
        return x.to(dtype)
    return x.clamp(-FP8_LIMIT, FP8_LIMIT).to(dtype)


def _indexable(cache: torch.Tensor) -> torch.Tensor:
    """A view ``index_copy_`` takes: bytes for an fp8 cache."""
    return cache.view(torch.uint8) if cache.dtype in FP8_DTYPES else cache


def write_to_cache(
    cache: torch.Tensor, slot_mapping: torch.Tensor, x: torch.Tensor
) -> None:
    """cache[slot_mapping[i]] = x[i]; x: [num_tokens, num_kv_heads, head_size]."""
    x = to_cache_dtype(x, cache.dtype)
    _indexable(cache).index_copy_(0, slot_mapping, _indexable(x))


def read_slots(
    cache: torch.Tensor, slot_mapping: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """cache[slot_mapping[i]] as ``dtype``: [num_tokens, num_kv_heads, head_size]."""
    rows = _indexable(cache).index_select(0, slot_mapping)
    return rows.view(cache.dtype).to(dtype)


def gather_blocks(
    cache: torch.Tensor, block_ids: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Blocks ``block_ids`` [N] -> ``[N, block_size, num_kv_heads, head_size]``."""
    return cache.unflatten(0, (-1, block_size)).index_select(0, block_ids)


def gather_blocks_by_head(
    cache: torch.Tensor, block_ids: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Blocks ``block_ids`` [N] -> ``[N, num_kv_heads, block_size, head_size]``,
    contiguous: one copy instead of gather-then-transpose before a matmul."""
    blocks = cache.unflatten(0, (-1, block_size)).transpose(1, 2)
    return blocks.index_select(0, block_ids)


def copy_blocks(
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    src_block_ids: torch.Tensor,
    dst_block_ids: torch.Tensor,
    block_size: int,
) -> None:
    """Copy blocks src -> dst in every cache; all sources are read before any
    destination is written, so overlapping src/dst sets behave as a parallel copy."""
    for key_cache, value_cache in kv_caches:
        for cache in (key_cache, value_cache):
            blocks = _indexable(gather_blocks(cache, src_block_ids, block_size))
            target = _indexable(cache).unflatten(0, (-1, block_size))
            target.index_copy_(0, dst_block_ids, blocks)
