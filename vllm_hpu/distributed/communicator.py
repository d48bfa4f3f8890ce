"""HpuCommunicator: vLLM's collectives for TP, PP and EP groups, on HCCL (Gaudi) or
gloo (emulation), both torch.distributed backends. Lazy mode must close the
pending graph before a collective reads its input (``mark_step``)."""

import torch
import torch.nn.functional as F
from torch.distributed import ProcessGroup
from vllm.distributed import get_dp_group, get_ep_group
from vllm.distributed.device_communicators.base_device_communicator import (
    DeviceCommunicatorBase,
)
from vllm.distributed.parallel_state import GroupCoordinator
from vllm.forward_context import get_forward_context

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

    def reduce_scatter(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        hpu_device.mark_step()
        return super().reduce_scatter(input_, dim)

    # ---- MoE layers with data parallelism (called on the expert group) ----
    # vLLM's naive dispatch: every DP rank's tokens go to every rank, whose
    # experts (shards, or whole experts with EP) add their part; the combine sums
    # the parts and returns each rank its tokens, padded to the ranks' largest
    # pass (one shape per set of buckets). With EP, TP and DP (sequence-parallel
    # experts) each TP rank brings its share and the exchange spans the EP group.

    def dispatch_router_logits(
        self,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor,
        is_sequence_parallel: bool = False,
        extra_tensors: list[torch.Tensor] | None = None,
    ) -> (
        tuple[torch.Tensor, torch.Tensor]
        | tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]
    ):
        """hidden_states: [num_tokens, hidden_size], router_logits: [num_tokens,
        num_experts] -> [group_size * max_num_tokens, ...] each, rank-major."""
        group, sizes = _exchange(is_sequence_parallel)
        max_num_tokens = max(sizes)
        gathered = [
            _gather_padded(t, max_num_tokens, group)
            for t in (hidden_states, router_logits)
        ]
        if extra_tensors is None:
            return gathered[0], gathered[1]
        extra = [_gather_padded(t, max_num_tokens, group) for t in extra_tensors]
        return gathered[0], gathered[1], extra

    def combine(
        self, hidden_states: torch.Tensor, is_sequence_parallel: bool = False
    ) -> torch.Tensor:
        """[group_size * max_num_tokens, hidden] -> [num_tokens, hidden]: a
        reduce-scatter, each rank getting its own rows' sums (as the reference)."""
        group, sizes = _exchange(is_sequence_parallel)
        mine = group.reduce_scatter(hidden_states, dim=0)
        return mine[: sizes[group.rank_in_group]]


def _exchange(is_sequence_parallel: bool) -> tuple[GroupCoordinator, list[int]]:
    """The MoE exchange group and each member's token count: the DP ranks' agreed
    passes, or with sequence-parallel experts each EP rank's share (DP major)."""
    dp_metadata = get_forward_context().dp_metadata
    assert dp_metadata is not None, "a MoE pass with data parallelism"
    if is_sequence_parallel:
        sizes = dp_metadata.get_chunk_sizes_across_dp_rank()
        assert sizes is not None
        return get_ep_group(), list(sizes)
    return get_dp_group(), dp_metadata.num_tokens_across_dp_cpu.tolist()


def _gather_padded(
    tensor: torch.Tensor, max_num_tokens: int, group: GroupCoordinator
) -> torch.Tensor:
    """[num_tokens, ...] padded and all-gathered: [group_size * max_num_tokens, ...]."""
    padding = max_num_tokens - tensor.shape[0]
    padded = F.pad(tensor, (0, 0) * (tensor.dim() - 1) + (0, padding))
    return group.all_gather(padded.contiguous(), dim=0)
