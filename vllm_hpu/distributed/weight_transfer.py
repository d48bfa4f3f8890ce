"""Weight transfer for Gaudi and its emulation: vLLM backend ``"hpu"``.

vLLM's ``nccl`` and ``ipc`` engines need CUDA. Here the trainer (on the same
host) writes each chunk of checkpoint-format tensors into a file under
``/dev/shm``; every worker copies it to its device and loads it with the
model's ``load_weights`` inside vLLM's layerwise reload, so a tensor-parallel
worker keeps its shard only. A trainer elsewhere sets ``master_address``: its
rank 0 and the workers form a gloo group and each chunk is broadcast through it.

Both sides are registered with vLLM's factories, so a trainer drives it as any
other backend::

    llm = LLM(model, weight_transfer_config=WeightTransferConfig(backend="hpu"))
    engine = WeightTransferTrainerFactory.trainer_init(
        HpuTrainerInitInfo(rank=0), client=client, source=ModuleSource(model)
    )
    engine.send_weights()
"""

import os
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Self

import torch
from torch.distributed import BroadcastOptions, ProcessGroup
from vllm.distributed.utils import (
    stateless_destroy_torch_distributed_process_group,
    stateless_init_torch_distributed_process_group,
)
from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    VLLMWeightSyncClient,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import (
    WeightTransferEngineFactory,
    WeightTransferTrainerFactory,
)

from vllm_hpu import compat, device

BACKEND = "hpu"
DEFAULT_CHUNK_BYTES = 1 << 30
_ALIGN = 64  # every tensor starts at a multiple: any dtype can view it


def _shared_memory_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


@dataclass
class HpuWeightTransferInitInfo(WeightTransferInitInfo):
    """Host shared memory by default; with ``master_address``, the gloo group to
    join, workers from rank ``rank_offset`` on (the trainer is rank 0)."""

    master_address: str = ""
    master_port: int = 0
    world_size: int = 0
    rank_offset: int = 1


@dataclass
class HpuTrainerInitInfo(TrainerInitInfo):
    backend: ClassVar[str] = BACKEND
    chunk_bytes: int = DEFAULT_CHUNK_BYTES  # host memory one chunk may take
    directory: str = ""  # where chunks are written; "" = /dev/shm
    # A gloo group instead of files: the sender and every worker.
    master_address: str = ""
    master_port: int = 0
    world_size: int = 0


@dataclass
class HpuWeightTransferUpdateInfo(WeightTransferUpdateInfo):
    """One chunk: ``path`` holds tensor i at byte ``offsets[i]``; without a
    path, the tensors come by broadcast, in this order."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    path: str = ""
    offsets: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        lengths = {len(self.names), len(self.dtype_names), len(self.shapes)}
        if self.path:
            lengths.add(len(self.offsets))
        if len(lengths) != 1:
            raise ValueError(
                "names, dtype_names, shapes and offsets must have one entry per "
                f"tensor; got lengths {sorted(lengths)}"
            )


def _nbytes(dtype: torch.dtype, shape: list[int]) -> int:
    return torch.Size(shape).numel() * dtype.itemsize


def read_chunk(
    info: HpuWeightTransferUpdateInfo, torch_device: torch.device
) -> list[tuple[str, torch.Tensor]]:
    """The chunk's tensors, copied to ``torch_device``."""
    dtypes = [getattr(torch, name) for name in info.dtype_names]
    spans = zip(info.offsets, dtypes, info.shapes, strict=True)
    ends = [offset + _nbytes(dtype, shape) for offset, dtype, shape in spans]
    size = max(ends, default=0)
    if size == 0:
        return []
    data = torch.from_file(info.path, shared=False, size=size, dtype=torch.uint8)
    weights = []
    for name, dtype, shape, offset, end in zip(
        info.names, dtypes, info.shapes, info.offsets, ends, strict=True
    ):
        tensor = data[offset:end].view(dtype).reshape(shape)
        weights.append((name, tensor.to(torch_device, copy=True)))
    return weights


class HpuWeightTransferEngine(
    WeightTransferEngine[HpuWeightTransferInitInfo, HpuWeightTransferUpdateInfo]
):
    """The worker side: reads each chunk and loads it into the model."""

    init_info_cls = HpuWeightTransferInitInfo
    update_info_cls = HpuWeightTransferUpdateInfo
    supports_draft_weight_update = False

    group: ProcessGroup | None = None  # set when the trainer broadcasts

    def init_transfer_engine(self, init_info: HpuWeightTransferInitInfo) -> None:
        if init_info.master_address:
            self.group = join_group(
                init_info.master_address,
                init_info.master_port,
                init_info.rank_offset + self.parallel_config.rank,
                init_info.world_size,
            )

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import (
            initialize_layerwise_reload,
        )

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """vLLM's, with the device's own synchronize."""
        self.receive_weights(self.parse_update_info(update_info))
        device.synchronize()

    def receive_weights(self, update_info: HpuWeightTransferUpdateInfo) -> None:
        from vllm.model_executor.model_loader.mtp_validation import (
            disable_mtp_completeness_check,
        )

        if update_info.path:
            weights = read_chunk(update_info, self.device)
        else:
            weights = self._receive(update_info)
        model: Any = self.model  # vLLM's models add load_weights to nn.Module
        with disable_mtp_completeness_check():
            model.load_weights(weights)

    def _receive(
        self, info: HpuWeightTransferUpdateInfo
    ) -> list[tuple[str, torch.Tensor]]:
        if self.group is None:
            raise RuntimeError(
                "This update comes by broadcast: init_weight_transfer_engine "
                "needs the trainer's master_address first."
            )
        weights = []
        for name, dtype, shape in zip(
            info.names, info.dtype_names, info.shapes, strict=True
        ):
            tensor = torch.empty(shape, dtype=getattr(torch, dtype))
            broadcast(self.group, tensor)
            weights.append((name, tensor.to(self.device)))
        return weights

    def shutdown(self) -> None:
        if self.group is not None:
            stateless_destroy_torch_distributed_process_group(self.group)
            self.group = None


def join_group(address: str, port: int, rank: int, world_size: int) -> ProcessGroup:
    """The trainer's and the workers' gloo group (host tensors, on Gaudi too)."""
    group = stateless_init_torch_distributed_process_group(
        address, port, rank, world_size, backend="gloo"
    )
    assert isinstance(group, ProcessGroup)
    return group


def broadcast(group: ProcessGroup, tensor: torch.Tensor) -> None:
    """``tensor`` from the group's rank 0 to every other rank, in place."""
    options = BroadcastOptions()
    options.rootRank = 0
    group.broadcast([tensor], options).wait()


def _chunks(
    source: WeightSource, chunk_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The source's tensors in groups of at most ``chunk_bytes`` (or one tensor)."""
    chunk: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in compat.weight_source_tensors(source):
        nbytes = tensor.numel() * tensor.element_size()
        if chunk and size + nbytes > chunk_bytes:
            yield chunk
            chunk, size = [], 0
        chunk.append((name, tensor))
        size += nbytes
    if chunk:
        yield chunk


def write_chunk(
    chunk: list[tuple[str, torch.Tensor]], path: str
) -> HpuWeightTransferUpdateInfo:
    """Write ``chunk``'s tensors to ``path``; what a worker needs to read them."""
    info = HpuWeightTransferUpdateInfo([], [], [], path, [])
    with open(path, "wb") as file:
        for name, tensor in chunk:
            file.write(bytes(-file.tell() % _ALIGN))
            info.names.append(name)
            info.dtype_names.append(str(tensor.dtype).removeprefix("torch."))
            info.shapes.append(list(tensor.shape))
            info.offsets.append(file.tell())
            data = tensor.detach().to("cpu").contiguous().reshape(-1)
            file.write(data.view(torch.uint8).numpy().data)
    return info


class HpuTrainerWeightTransferEngine(TrainerWeightTransferEngine[HpuTrainerInitInfo]):
    """The trainer side: each round hands the source over chunk by chunk, each
    loaded by the workers before the next."""

    init_info_cls = HpuTrainerInitInfo

    def __init__(
        self,
        *,
        client: VLLMWeightSyncClient,
        source: WeightSource,
        is_sender: bool,
        init_info: HpuTrainerInitInfo,
    ):
        super().__init__(
            client=client,
            source=source,
            is_sender=is_sender,
            **compat.trainer_engine_kwargs(init_info.rank),
        )
        self.chunk_bytes = init_info.chunk_bytes
        self.directory = init_info.directory or _shared_memory_dir()
        self.group: ProcessGroup | None = None  # with a master_address

    @classmethod
    def trainer_init(
        cls,
        init_info: HpuTrainerInitInfo,
        *,
        client: VLLMWeightSyncClient,
        source: WeightSource | None = None,
    ) -> Self:
        if source is None:
            raise ValueError("The hpu weight transfer sends a WeightSource.")
        engine = cls(
            client=client,
            source=source,
            is_sender=init_info.is_sender,
            init_info=init_info,
        )
        if engine.is_sender and init_info.master_address:
            engine.group = engine._rendezvous(init_info)
        elif engine.is_sender:
            client.init_weight_transfer_engine({})
        return engine

    def _rendezvous(self, init_info: HpuTrainerInitInfo) -> ProcessGroup:
        """Join the group as rank 0 while the workers join it (in their RPC)."""
        address, port = init_info.master_address, init_info.master_port
        worker_info = HpuWeightTransferInitInfo(address, port, init_info.world_size)
        with ThreadPoolExecutor(1) as pool:
            joined = pool.submit(
                self.client.init_weight_transfer_engine, asdict(worker_info)
            )
            group = join_group(address, port, 0, init_info.world_size)
            joined.result()
        return group

    def send_weights(self) -> None:
        """One round; other ranks only iterate the source (it may gather shards)."""
        assert self.source is not None
        if not self.is_sender:
            for _ in compat.weight_source_tensors(self.source):
                pass
            return
        self.client.start_weight_update()
        if self.group is not None:
            self._broadcast_chunks(self.group)
        else:
            self._write_chunks()
        self.client.finish_weight_update()

    def _write_chunks(self) -> None:
        assert self.source is not None
        path = os.path.join(self.directory, f"vllm-hpu-weights-{uuid.uuid4().hex}")
        try:
            for chunk in _chunks(self.source, self.chunk_bytes):
                self.client.update_weights(asdict(write_chunk(chunk, path)))
        finally:
            if os.path.exists(path):
                os.unlink(path)

    def _broadcast_chunks(self, group: ProcessGroup) -> None:
        assert self.source is not None
        for chunk in _chunks(self.source, self.chunk_bytes):
            tensors = [t.detach().to("cpu").contiguous() for _, t in chunk]
            info = HpuWeightTransferUpdateInfo(
                names=[name for name, _ in chunk],
                dtype_names=[str(t.dtype).removeprefix("torch.") for t in tensors],
                shapes=[list(t.shape) for t in tensors],
            )
            with ThreadPoolExecutor(1) as pool:  # the workers receive meanwhile
                received = pool.submit(self.client.update_weights, asdict(info))
                for tensor in tensors:
                    broadcast(group, tensor)
                received.result()

    def shutdown(self) -> None:
        if self.group is not None:
            stateless_destroy_torch_distributed_process_group(self.group)
            self.group = None


class LLMClient:
    """vLLM's trainer-side client protocol (``VLLMWeightSyncClient``) over an
    offline ``vllm.LLM`` in a process of the trainer's own."""

    def __init__(self, llm: Any):
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]):
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.llm.finish_weight_update(weight_version)


def register() -> None:
    """Make ``"hpu"`` a backend of vLLM's factories (idempotent)."""
    module = __name__
    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(
            BACKEND, module, "HpuWeightTransferEngine"
        )
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(
            BACKEND, module, "HpuTrainerWeightTransferEngine"
        )


# A trainer process that only imports this module (for HpuTrainerInitInfo) finds
# the backend registered, as vLLM's built-in ones are once their factory loads.
register()
