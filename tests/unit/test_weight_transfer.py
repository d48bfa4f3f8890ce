"""The "hpu" weight transfer backend (vllm_hpu/distributed/weight_transfer.py)
without an engine: chunks written by the trainer side read back bit for bit, and
one round drives vLLM's client protocol in order, every chunk within its size."""

import os
from typing import Any

import pytest
import torch
from vllm.distributed.weight_transfer import (
    ModuleSource,
    WeightTransferEngineFactory,
    WeightTransferTrainerFactory,
)

from vllm_hpu.distributed.weight_transfer import (
    HpuTrainerInitInfo,
    HpuWeightTransferUpdateInfo,
    read_chunk,
    write_chunk,
)


def test_chunks_read_back_exactly(tmp_path) -> None:
    chunk = [
        ("a", torch.randn(3, 5)),
        ("b", torch.randn(7).to(torch.bfloat16)),
        ("c", torch.arange(11, dtype=torch.int64).reshape(1, 11)),
        ("d", torch.randn(4, 6).t()),  # not contiguous
        ("e", torch.tensor(2.5, dtype=torch.float16)),
    ]
    info = write_chunk(chunk, str(tmp_path / "chunk"))
    assert all(offset % 64 == 0 for offset in info.offsets)
    read = read_chunk(info, torch.device("cpu"))
    assert [name for name, _ in read] == [name for name, _ in chunk]
    for (_, sent), (_, got) in zip(chunk, read, strict=True):
        assert got.dtype == sent.dtype and torch.equal(got, sent)


def test_update_info_checks_its_lists() -> None:
    # A broadcast chunk carries no file and no offsets.
    HpuWeightTransferUpdateInfo(names=["a"], dtype_names=["float32"], shapes=[[2]])
    with pytest.raises(ValueError, match="one entry per tensor"):
        HpuWeightTransferUpdateInfo(["a"], ["float32"], [[2]], path="/x", offsets=[])


class _Client:
    """vLLM's client protocol, reading every chunk as a worker would."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.received: dict[str, torch.Tensor] = {}

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.calls.append("init")

    def start_weight_update(self) -> None:
        self.calls.append("start")

    def update_weights(self, update_info: Any) -> None:
        info = HpuWeightTransferUpdateInfo(**update_info)
        self.calls.append(f"update {len(info.names)}")
        self.received |= dict(read_chunk(info, torch.device("cpu")))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.calls.append("finish")


def test_a_round_sends_the_source_in_chunks(tmp_path) -> None:
    assert "hpu" in WeightTransferEngineFactory._registry
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    client = _Client()
    engine = WeightTransferTrainerFactory.trainer_init(
        # 16x16 float32 is 1 KiB: each weight takes a chunk, biases join it
        HpuTrainerInitInfo(rank=0, chunk_bytes=1100, directory=str(tmp_path)),
        client=client,
        source=ModuleSource(model),
    )
    engine.send_weights()
    assert client.calls == ["init", "start", "update 2", "update 2", "finish"]
    assert client.received.keys() == dict(model.named_parameters()).keys()
    for name, param in model.named_parameters():
        assert torch.equal(client.received[name], param.detach())
    assert os.listdir(tmp_path) == []  # the chunk file is gone


class _CountingSource(ModuleSource):
    """Counts the pairs a pass yields: by iteration on vLLM 0.32, by
    ``iter_full()`` on 0.33 (compat.weight_source_tensors)."""

    yielded = 0

    def _count(self, pairs: Any) -> Any:
        for pair in pairs:
            self.yielded += 1
            yield pair

    def __iter__(self) -> Any:
        return self._count(super().__iter__())  # type: ignore[misc]

    def iter_full(self) -> Any:
        return self._count(super().iter_full())  # type: ignore[misc]


def test_a_rank_that_does_not_send_iterates_its_source_only(tmp_path) -> None:
    """Another trainer rank runs its source's collectives (an FSDP all-gather)
    in step with the sender, and drives no RPC."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    client = _Client()
    source = _CountingSource(model)
    engine = WeightTransferTrainerFactory.trainer_init(
        HpuTrainerInitInfo(rank=1, directory=str(tmp_path)),
        client=client,
        source=source,
    )
    engine.send_weights()
    assert client.calls == []
    assert source.yielded == 4
