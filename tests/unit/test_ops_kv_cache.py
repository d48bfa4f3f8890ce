"""The flat KV cache: allocation, writes and reads by slot, block gathers, block
copies."""

import pytest
import torch

from vllm_hpu.ops.kv_cache import (
    allocate_kv_cache,
    copy_blocks,
    gather_blocks,
    kv_cache_shape,
    read_slots,
    write_to_cache,
)


def test_kv_cache_allocate_has_dummy_block_and_zeros() -> None:
    key_cache, value_cache = allocate_kv_cache(
        3, 16, 2, 64, torch.bfloat16, torch.device("cpu")
    )
    assert key_cache.shape == value_cache.shape == (4 * 16, 2, 64)
    assert kv_cache_shape(3, 16, 2, 64) == (2, 4 * 16, 2, 64)
    assert key_cache.dtype == torch.bfloat16
    assert not key_cache.any() and not value_cache.any()
    key_cache.fill_(1)
    assert not value_cache.any()


@pytest.mark.parametrize("block_size", [16, 128])
def test_kv_cache_write_then_gather_roundtrip(block_size: int) -> None:
    num_blocks = 5
    cache, _ = allocate_kv_cache(num_blocks, block_size, 2, 8, torch.float32, "cpu")
    block_ids = torch.tensor([3, 0, 4])
    slots = (block_ids[:, None] * block_size + torch.arange(block_size)).flatten()
    x = torch.randn(slots.numel(), 2, 8)
    write_to_cache(cache, slots, x)
    gathered = gather_blocks(cache, block_ids, block_size)
    torch.testing.assert_close(gathered, x.view(3, block_size, 2, 8))
    untouched = gather_blocks(cache, torch.tensor([1, 2, num_blocks]), block_size)
    assert not untouched.any()


def test_kv_cache_copy_blocks_reads_all_sources_first() -> None:
    block_size = 16
    caches = [
        allocate_kv_cache(4, block_size, 1, 4, torch.float32, "cpu") for _ in "ab"
    ]
    for key_cache, value_cache in caches:
        key_cache.copy_(torch.randn_like(key_cache))
        value_cache.copy_(torch.randn_like(value_cache))
    before = [(k.clone(), v.clone()) for k, v in caches]
    # A swap and a chain: 0 -> 1, 1 -> 0, 1 -> 2.
    src, dst = torch.tensor([0, 1, 1]), torch.tensor([1, 0, 2])
    copy_blocks(caches, src, dst, block_size)
    for (key_cache, value_cache), (old_key, old_value) in zip(
        caches, before, strict=True
    ):
        for new, old in ((key_cache, old_key), (value_cache, old_value)):
            torch.testing.assert_close(
                gather_blocks(new, dst, block_size), gather_blocks(old, src, block_size)
            )
            torch.testing.assert_close(
                gather_blocks(new, torch.tensor([3, 4]), block_size),
                gather_blocks(old, torch.tensor([3, 4]), block_size),
            )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float8_e4m3fn])
def test_kv_cache_read_slots_returns_what_was_written(dtype: torch.dtype) -> None:
    """A KV-sharing layer reads the keys its target wrote, upcast."""
    cache, _ = allocate_kv_cache(3, 16, 2, 8, dtype, "cpu")
    slots = torch.tensor([5, 40, 17, 63])
    x = torch.randn(4, 2, 8)
    write_to_cache(cache, slots, x)
    expected = x.to(dtype).to(torch.float32)
    torch.testing.assert_close(read_slots(cache, slots, torch.float32), expected)
