"""Block copies between a device cache and a host buffer, by block id.

The platform's ``insert_blocks_to_device`` / ``swap_out_blocks_to_host`` (NIXL's
host buffer on Gaudi) and the offloading worker both copy whole blocks along dim
0 of block-major tensors (``layout.py``). All source blocks are gathered before
any destination is written, so overlapping id sets copy as one parallel copy.
"""

import torch

from vllm_hpu.ops.kv_cache import FP8_DTYPES


def _indexable(cache: torch.Tensor) -> torch.Tensor:
    """``index_copy_`` does not take fp8 on the CPU: copy fp8 blocks as bytes."""
    return cache.view(torch.uint8) if cache.dtype in FP8_DTYPES else cache


def copy_blocks(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_block_ids: torch.Tensor,
    dst_block_ids: torch.Tensor,
) -> None:
    """``dst[dst_block_ids[i]] = src[src_block_ids[i]]``; src and dst may be on
    different devices (the copy crosses once, after the gather)."""
    blocks = _indexable(src).index_select(0, src_block_ids.to(src.device))
    dst_ids = dst_block_ids.to(dst.device)
    _indexable(dst).index_copy_(0, dst_ids, blocks.to(dst.device))
