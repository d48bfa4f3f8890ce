"""What KV connectors see of the flat caches: block-major views of the same
memory, block copies to and from host buffers, and the offloading copier."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from vllm_hpu.kv_transfer.blocks import copy_blocks
from vllm_hpu.kv_transfer.layout import (
    block_major_view,
    block_pages,
    connector_kv_cache_config,
)
from vllm_hpu.kv_transfer.offloading import HostBlockCopier, host_rows
from vllm_hpu.ops.kv_cache import allocate_kv_cache, write_to_cache
from vllm_hpu.ops.mla_kernels import allocate_latent_cache

NUM_BLOCKS, BLOCK_SIZE, HEADS, HEAD_SIZE = 5, 4, 2, 8


def _filled_cache(dtype: torch.dtype = torch.float32):
    key_cache, value_cache = allocate_kv_cache(
        NUM_BLOCKS, BLOCK_SIZE, HEADS, HEAD_SIZE, dtype, torch.device("cpu")
    )
    slots = torch.arange(key_cache.shape[0])
    write_to_cache(key_cache, slots, torch.randn(slots.numel(), HEADS, HEAD_SIZE))
    write_to_cache(value_cache, slots, torch.randn(slots.numel(), HEADS, HEAD_SIZE))
    return key_cache, value_cache


def test_kv_transfer_view_is_the_cache_block_major() -> None:
    key_cache, value_cache = _filled_cache()
    view = block_major_view((key_cache, value_cache), BLOCK_SIZE)
    assert view.shape == (NUM_BLOCKS + 1, 2, BLOCK_SIZE, HEADS * HEAD_SIZE)
    assert view.data_ptr() == key_cache.data_ptr()  # a view: no copy
    for block in range(NUM_BLOCKS + 1):
        rows = slice(block * BLOCK_SIZE, (block + 1) * BLOCK_SIZE)
        assert torch.equal(view[block, 0], key_cache[rows].flatten(1))
        assert torch.equal(view[block, 1], value_cache[rows].flatten(1))
    # vLLM's NIXL connector splits the view into segments of num_blocks + 1
    # blocks at the block stride: the values start one segment after the keys.
    block_stride = view.stride(0) * view.element_size()
    segment = (NUM_BLOCKS + 1) * block_stride
    assert view.nbytes == 2 * segment
    assert value_cache.data_ptr() == key_cache.data_ptr() + segment
    view[2, 1].fill_(7.0)  # writes through to the flat cache
    assert (value_cache[2 * BLOCK_SIZE : 3 * BLOCK_SIZE] == 7.0).all()


def test_kv_transfer_pages_are_contiguous_runs_of_bytes() -> None:
    key_cache, value_cache = _filled_cache(torch.bfloat16)
    keys, values = block_pages(block_major_view((key_cache, value_cache), BLOCK_SIZE))
    run_bytes = BLOCK_SIZE * HEADS * HEAD_SIZE * 2
    assert keys.shape == values.shape == (NUM_BLOCKS + 1, run_bytes)
    assert keys.dtype == torch.int8 and keys.stride() == (run_bytes, 1)
    block = key_cache[BLOCK_SIZE : 2 * BLOCK_SIZE].contiguous()
    assert torch.equal(keys[1], block.view(torch.int8).flatten())
    latent = allocate_latent_cache(NUM_BLOCKS, BLOCK_SIZE, 12, torch.float32, "cpu")
    (latent_run,) = block_pages(block_major_view(latent, BLOCK_SIZE))
    assert latent_run.shape == (NUM_BLOCKS + 1, BLOCK_SIZE * 12 * 4)


def test_kv_transfer_connectors_count_the_dummy_block() -> None:
    config = KVCacheConfig(
        num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=[]
    )
    assert connector_kv_cache_config(config).num_blocks == NUM_BLOCKS + 1
    assert config.num_blocks == NUM_BLOCKS


@pytest.mark.parametrize("dtype", [torch.float32, torch.float8_e4m3fn])
def test_kv_transfer_block_copies_through_a_host_buffer(dtype: torch.dtype) -> None:
    key_cache, value_cache = _filled_cache(dtype)
    view = block_major_view((key_cache, value_cache), BLOCK_SIZE)
    before = view.clone() if dtype == torch.float32 else view.view(torch.uint8).clone()
    host = torch.zeros((3, *view.shape[1:]), dtype=dtype)
    copy_blocks(view, host, torch.tensor([4, 1, 2]), torch.tensor([0, 1, 2]))
    # Back, rotated: every source is read before a destination is written.
    copy_blocks(host, view, torch.tensor([0, 1, 2]), torch.tensor([1, 2, 4]))
    after = view if dtype == torch.float32 else view.view(torch.uint8)
    for src, dst in ((4, 1), (1, 2), (2, 4)):
        assert torch.equal(after[dst], before[src])
    assert torch.equal(after[0], before[0]) and torch.equal(after[3], before[3])


def test_kv_transfer_nixl_host_buffer_takes_the_views() -> None:
    """On Gaudi vLLM's NIXL worker stages blocks through host buffers it shapes
    after the registered caches, and copies them with the platform's hooks."""
    from vllm.distributed.kv_transfer.kv_connector.utils import copy_kv_blocks
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import (
        NixlBaseConnectorWorker,
    )

    views = {
        f"layers.{i}": block_major_view(_filled_cache(), BLOCK_SIZE) for i in (0, 1)
    }
    before = {name: view.clone() for name, view in views.items()}
    worker = SimpleNamespace(
        use_mla=False, kv_cache_layout="LBHNC", kv_transfer_config=None
    )
    NixlBaseConnectorWorker.initialize_host_xfer_buffer(worker, views)
    host = worker.host_xfer_buffers
    assert all(host[name].shape == views[name].shape for name in views)
    copy_kv_blocks(views, host, [3, 1], [0, 2], "d2h")  # a prefill saves
    copy_kv_blocks(host, views, [0, 2], [4, 5], "h2d")  # a decode receives
    for name, view in views.items():
        assert torch.equal(view[4], before[name][3])
        assert torch.equal(view[5], before[name][1])
        assert torch.equal(view[:4], before[name][:4])


def test_kv_transfer_host_rows_follow_chunks_and_skips() -> None:
    # One group, chunks of 4 blocks; the request's first block is its 6th
    # (inside chunk 7 at row 1), so rows start there and run into chunk 2.
    spec = GPULoadStoreSpec([10, 11, 12, 13, 14], group_sizes=[5], block_indices=[5])
    rows = host_rows(np.array([7, 2]), spec, blocks_per_chunk=4)
    assert rows.tolist() == [29, 30, 31, 8, 9]
    aligned = GPULoadStoreSpec([3, 4], group_sizes=[2], block_indices=[0])
    assert host_rows(np.array([6, 1]), aligned, 1).tolist() == [6, 1]


def test_kv_transfer_host_copier_stores_and_loads_blocks() -> None:
    key_cache, value_cache = _filled_cache()
    pages = block_pages(block_major_view((key_cache, value_cache), BLOCK_SIZE))
    caches = CanonicalKVCaches(
        [CanonicalKVCacheTensor(p, p.shape[1]) for p in pages],
        [[CanonicalKVCacheRef(i, p.shape[1]) for i, p in enumerate(pages)]],
    )
    copier = HostBlockCopier(caches, blocks_per_chunk=1, num_chunks=4)
    before = [p.clone() for p in pages]
    gpu = GPULoadStoreSpec([1, 3], group_sizes=[2], block_indices=[0])
    assert copier.submit_store(7, gpu, CPULoadStoreSpec([2, 0]))
    (stored,) = copier.get_finished()
    assert (stored.job_id, stored.success) == (7, True)
    assert stored.transfer_size == 2 * sum(p.shape[1] for p in pages)
    for page in pages:
        page.zero_()
    assert copier.submit_load(
        8,
        CPULoadStoreSpec([0]),
        GPULoadStoreSpec([4], group_sizes=[1], block_indices=[0]),
    )
    assert [r.job_id for r in copier.get_finished()] == [8]
    for page, old in zip(pages, before, strict=True):
        assert torch.equal(page[4], old[3])  # host chunk 0 held block 3
        assert not page[:4].any()
