"""HPU graphs as the bridge captures them: device work recorded once, replayed
on the same tensors.

A capture records every operator that touches the device (reads or writes an
HPU tensor, or makes one), with the very tensor objects it ran on. A replay runs
those operators again on those objects: views keep aliasing what they aliased,
in-place operators write where they wrote, and other results are copied into
the tensors the capture produced, whose addresses are fixed. So a replay sees
in-place updates of any tensor the capture used, but never a tensor made after
the capture: only the graph's inputs, copied into the capture-time inputs
before each replay (hpu/graphs.py), carry new data in. Host code inside the
captured function does not run again; its results are frozen.
"""

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from habana_frameworks.torch._double import native


def _touches_device(args: Any, kwargs: Any, out: Any) -> bool:
    leaves, _ = tree_flatten((args, kwargs, out))
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor) and leaf.device.type == "hpu":
            return True
        if isinstance(leaf, torch.device) and leaf.type == "hpu":
            return True
    return False


class _Operator:
    __slots__ = ("args", "func", "kwargs", "out")

    def __init__(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        self.func = func
        self.args = args
        self.kwargs = kwargs
        self.out = out


class Recording(TorchDispatchMode):
    """The operators run while it is active that touch the device."""

    def __init__(self) -> None:
        super().__init__()
        self.operators: list[_Operator] = []
        self.host_reads = 0

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is torch.ops.aten._local_scalar_dense.default:
            self.host_reads += 1
        elif _touches_device(args, kwargs, out):
            self.operators.append(_Operator(func, args, kwargs, out))
        return out


def _copy_results(recorded: Any, fresh: Any) -> None:
    old, _ = tree_flatten(recorded)
    new, _ = tree_flatten(fresh)
    for before, now in zip(old, new, strict=True):
        if isinstance(before, torch.Tensor) and isinstance(now, torch.Tensor):
            before.copy_(now)


def replay(operators: list[_Operator]) -> None:
    """Runs the recorded operators again on the recorded tensors."""
    native.pause_counting(True)
    try:
        for op in operators:
            if op.func.is_view:
                continue
            fresh = op.func(*op.args, **op.kwargs)
            if not op.func._schema.is_mutable:
                _copy_results(op.out, fresh)
    finally:
        native.pause_counting(False)
