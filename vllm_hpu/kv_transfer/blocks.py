"""Block copies between a device cache and a host buffer, by block id, along dim
0 of block-major tensors (``layout.py``), for ``insert_blocks_to_device`` /
``swap_out_blocks_to_host`` and the offloading worker. All sources are gathered
before any destination is written, so overlapping id sets are safe."""

import torch

from vllm_hpu.ops.kv_cache import FP8_DTYPES

WORD = torch.int64


def _indexable(cache: torch.Tensor) -> torch.Tensor:
    """One-byte blocks (fp8, offloaded byte runs) as 8-byte words where rows allow: CPU
    index ops move bytes singly, and ``index_copy_`` takes no fp8."""
    if cache.element_size() != 1:
        return cache
    as_bytes = cache.view(torch.uint8) if cache.dtype in FP8_DTYPES else cache
    word = WORD.itemsize
    aligned = cache.shape[-1] % word == 0 and cache.storage_offset() % word == 0
    strides = cache.stride()
    if aligned and strides[-1] == 1 and all(s % word == 0 for s in strides[:-1]):
        return as_bytes.view(WORD)
    return as_bytes


def copy_blocks(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_block_ids: torch.Tensor,
    dst_block_ids: torch.Tensor,
) -> None:
    """``dst[dst_ids[i]] = src[src_ids[i]]``, across devices once, after the gather."""
    blocks = _indexable(src).index_select(0, src_block_ids.to(src.device))
    dst_ids = dst_block_ids.to(dst.device)
    _indexable(dst).index_copy_(0, dst_ids, blocks.to(dst.device))
