"""HpuCommunicator: vLLM's collectives for tensor and pipeline parallel groups.

HCCL on Gaudi, gloo on CPU processes in emulation; both are torch.distributed
backends, so the collectives are torch's own. Lazy mode must close the pending
graph before a collective reads its input, hence ``mark_step`` first.
"""

import torch
from torch.distributed import ProcessGroup
from vllm.distributed.device_communicators.base_device_communicator import (
    DeviceCommunicatorBase,
)

from vllm_hpu import device as hpu_device


class HpuCommunicator(DeviceCommunicatorBase):
    def __init__(
        self,
        cpu_group: ProcessGroup,
        device: torch.device | None = None,
        device_group: ProcessGroup | None = None,
        unique_name: str = "",
        use_all2all: bool = False,
    ):
        super().__init__(
            cpu_group, device, device_group, unique_name, use_all2all=use_all2all
        )
        # vLLM names an out-of-tree device after the platform ("hpu:<rank>"),
        # which does not exist in emulation; received tensors go where ours live.
        self.device = hpu_device.local_device(self.device)

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        hpu_device.mark_step()
        return super().all_reduce(input_)

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        hpu_device.mark_step()
        return super().all_gather(input_, dim)

    def gather(
        self, input_: torch.Tensor, dst: int = 0, dim: int = -1
    ) -> torch.Tensor | None:
        hpu_device.mark_step()
        return super().gather(input_, dst, dim)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        hpu_device.mark_step()
        return super().broadcast(tensor, src)

    def send(self, tensor: torch.Tensor, dst: int | None = None) -> None:
        hpu_device.mark_step()
        super().send(tensor, dst)
