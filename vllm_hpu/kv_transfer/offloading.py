"""KV offloading to host memory (``--kv-offloading-size``): vLLM's
``OffloadingConnector`` with a registration of each block's two runs (our flat
caches are not one run per block) and a spec whose worker copies blocks with
index ops (``HostBlockCopier``) instead of CUDA streams and kernels."""

import time
from collections.abc import Sequence

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
    get_offloading_group_ids,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)
from vllm.utils.math_utils import cdiv
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from vllm_hpu import device
from vllm_hpu.kv_transfer.blocks import copy_blocks
from vllm_hpu.kv_transfer.layout import block_pages


class HpuOffloadingConnector(OffloadingConnector):
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """``kv_caches``: each layer's ``layout.block_major_view``."""
        worker = self.connector_worker
        assert worker is not None
        config = worker.kv_cache_config
        tensors: list[CanonicalKVCacheTensor] = []
        group_refs: list[list[CanonicalKVCacheRef]] = []
        for group_id in get_offloading_group_ids(config):
            refs = []
            for layer_name in config.kv_cache_groups[group_id].layer_names:
                for run in block_pages(kv_caches[layer_name]):
                    refs.append(CanonicalKVCacheRef(len(tensors), run.shape[1]))
                    tensors.append(CanonicalKVCacheTensor(run, run.shape[1]))
            group_refs.append(refs)
        worker.worker = worker.spec.get_worker(CanonicalKVCaches(tensors, group_refs))


class HpuOffloadingSpec(CPUOffloadingSpec):
    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        return HostBlockCopier(kv_caches, self.blocks_per_chunk, self.num_chunks)


class HostBlockCopier(OffloadingWorker):
    """Block copies between device caches and host memory: each run ``[num_blocks + 1,
    run_bytes]`` has a host twin; copies complete before ``submit_*`` returns."""

    def __init__(
        self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, num_chunks: int
    ):
        self.device_runs = [t.tensor for t in kv_caches.tensors]
        self.host_runs = [
            torch.zeros(
                (num_chunks * blocks_per_chunk, t.page_size_bytes),
                dtype=torch.int8,
                pin_memory=device.hpu_available(),
            )
            for t in kv_caches.tensors
        ]
        self.group_tensor_ids = [
            [ref.tensor_idx for ref in refs] for refs in kv_caches.group_data_refs
        ]
        self.blocks_per_chunk = blocks_per_chunk
        self.finished: list[TransferResult] = []

    def submit_store(
        self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec
    ) -> bool:
        self._copy(job_id, src_spec, dst_spec, to_host=True)
        return True

    def submit_load(
        self,
        job_id: int,
        src_spec: LoadStoreSpec,
        dst_spec: GPULoadStoreSpec,
        expedited: bool = False,
    ) -> bool:
        """``expedited`` (vLLM 0.33: a load its request waits on within the
        step) changes nothing here: every copy is done when this returns."""
        self._copy(job_id, dst_spec, src_spec, to_host=False)
        return True

    def get_finished(self) -> list[TransferResult]:
        finished, self.finished = self.finished, []
        return finished

    def wait(self, job_ids: set[int]) -> None:
        return  # every copy completes in submit_*

    def _copy(
        self,
        job_id: int,
        device_spec: GPULoadStoreSpec,
        host_spec: LoadStoreSpec,
        to_host: bool,
    ) -> None:
        started = time.perf_counter()
        assert isinstance(host_spec, BlockIDsLoadStoreSpec)
        rows = host_rows(host_spec.block_ids, device_spec, self.blocks_per_chunk)
        device_ids = torch.from_numpy(device_spec.block_ids.astype(np.int64))
        num_bytes, start = 0, 0
        for tensor_ids, size in zip(
            self.group_tensor_ids, device_spec.group_sizes, strict=True
        ):
            blocks = device_ids[start : start + size]
            host_ids = torch.from_numpy(rows[start : start + size])
            for i in tensor_ids:
                src, dst = self.device_runs[i], self.host_runs[i]
                if to_host:
                    copy_blocks(src, dst, blocks, host_ids)
                else:
                    copy_blocks(dst, src, host_ids, blocks)
                num_bytes += size * dst.shape[1]
            start += size
        elapsed = time.perf_counter() - started
        self.finished.append(TransferResult(job_id, True, num_bytes, elapsed))


def host_rows(
    chunk_ids: np.ndarray, device_spec: GPULoadStoreSpec, blocks_per_chunk: int
) -> np.ndarray:
    """The host row of each device block in ``device_spec``: per group, its chunks'
    rows from the group's first block on (``block_indices`` says where it starts)."""
    rows: list[np.ndarray] = []
    sizes: Sequence[int] = device_spec.group_sizes
    first_chunk = 0
    for size, first_block in zip(sizes, device_spec.block_indices, strict=True):
        skip = first_block % blocks_per_chunk
        num_chunks = cdiv(skip + size, blocks_per_chunk)
        chunks = chunk_ids[first_chunk : first_chunk + num_chunks].astype(np.int64)
        all_rows = chunks[:, None] * blocks_per_chunk + np.arange(blocks_per_chunk)
        rows.append(all_rows.ravel()[skip : skip + size])
        first_chunk += num_chunks
    return np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
