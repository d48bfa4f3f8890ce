"""Pipeline stages: every stage plans the same padded passes from the same
scheduler output, so a stage sends one message per step, each pass's
intermediate tensors joined along the token axis, split back by padded sizes."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from vllm.distributed import get_pp_group, get_tp_group
from vllm.sequence import IntermediateTensors


@dataclass(frozen=True)
class Stage:
    is_first: bool
    is_last: bool

    @classmethod
    def of_this_rank(cls) -> "Stage":
        group = get_pp_group()
        return cls(is_first=group.is_first_rank, is_last=group.is_last_rank)


def stage_inputs(
    stage: Stage,
    sizes: list[int],
    received: IntermediateTensors | None,
    make_empty: Callable[[int], IntermediateTensors],
) -> Sequence[IntermediateTensors | None]:
    """Per pass of ``sizes`` tokens, this stage's input: nothing on the first stage,
    else the previous stage's tensors (``make_empty`` zeros in warmup)."""
    if stage.is_first:
        return [None] * len(sizes)
    if received is None:
        return [make_empty(size) for size in sizes]
    return split(received, sizes)


def join(outputs: list[IntermediateTensors]) -> IntermediateTensors:
    keys = outputs[0].tensors.keys()
    return IntermediateTensors(
        {key: torch.cat([output[key] for output in outputs]) for key in keys}
    )


def split(received: IntermediateTensors, sizes: list[int]) -> list[IntermediateTensors]:
    """``received`` cut into one IntermediateTensors per pass of ``sizes`` tokens."""
    assert all(len(t) == sum(sizes) for t in received.tensors.values()), (
        "the previous stage planned different passes for this step"
    )
    parts = {key: tensor.split(sizes) for key, tensor in received.tensors.items()}
    return [
        IntermediateTensors({key: chunks[i] for key, chunks in parts.items()})
        for i in range(len(sizes))
    ]


def send(output: IntermediateTensors) -> None:
    # Each TP rank sends a slice; the next stage all-gathers the whole.
    get_pp_group().send_tensor_dict(output.tensors, all_gather_group=get_tp_group())


def receive() -> IntermediateTensors:
    tensors = get_pp_group().recv_tensor_dict(all_gather_group=get_tp_group())
    assert tensors is not None, "only stages after the first receive"
    return IntermediateTensors(tensors)
