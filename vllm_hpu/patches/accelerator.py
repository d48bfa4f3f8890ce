"""torch.accelerator calls where torch has no accelerator (CPU emulation)."""

import functools
import time

import torch

# torch.accelerator calls in CPU emulation.
# Why: vLLM's model loader and shutdown call ``torch.accelerator.empty_cache``,
# ``synchronize`` and ``empty_host_cache`` unconditionally; on a CPU-only torch they
# raise "Cannot access accelerator device when none is available". vLLM skips them
# only for its own CPU platform (``vllm/v1/worker/cpu_model_runner.py``).
# How: in CPU emulation, and only when torch reports no accelerator, those three
# functions become no-ops, which is what they mean on a machine without one.
# Upstream change that removes it: vLLM guarding those calls with
# ``torch.accelerator.is_available()``.
# The same for the events and current stream of vLLM's expert load balancing
# (distributed/eplb): rank 0 times each rearrangement with ``torch.Event`` and
# the gloo weight exchange synchronizes ``torch.accelerator.current_stream()``
# before sending; on a CPU-only torch both raise ("cpu backend doesn't support
# events"). Here an event is a host timestamp and the stream has nothing to
# wait for: CPU work is done when its call returns. Upstream change that removes
# it: the same guard there.


class HostEvent:
    """``torch.Event`` on the host: a timestamp, nothing to wait for."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.recorded_s = time.perf_counter()

    def record(self, stream: object = None) -> None:
        self.recorded_s = time.perf_counter()

    def elapsed_time(self, end: "HostEvent") -> float:
        return (end.recorded_s - self.recorded_s) * 1e3  # milliseconds, as torch's

    def synchronize(self) -> None:
        return None

    def wait(self, stream: object = None) -> None:
        return None


class HostStream:
    """``torch.accelerator.current_stream()`` on the host."""

    def synchronize(self) -> None:
        return None


def _noop(*args: object, **kwargs: object) -> None:
    return None


@functools.cache
def apply_emulation_patches() -> None:
    """Idempotent; call only in CPU emulation."""
    if torch.accelerator.is_available():
        return
    for name in ("empty_cache", "synchronize", "empty_host_cache"):
        if hasattr(torch.accelerator, name):
            setattr(torch.accelerator, name, _noop)
    torch.Event = HostEvent  # type: ignore[misc, assignment]
    torch.accelerator.current_stream = lambda device=None: HostStream()  # type: ignore[assignment, return-value]
