"""torch.accelerator's cache calls where they fail: CPU emulation and Gaudi.

Why: vLLM's model loader and shutdown call ``torch.accelerator.empty_cache``
(and at shutdown ``empty_host_cache``) unconditionally. On a CPU-only torch
they raise "Cannot access accelerator device when none is available"; vLLM
skips them only for its own CPU platform (``vllm/v1/worker/cpu_model_runner.py``).
On Habana's torch the device's allocator is a plain ``c10::Allocator``, so
``empty_cache`` raises "Allocator for hpu is not a DeviceAllocator", and
``empty_host_cache`` has no HPU hook (vllm-gaudi 091bbad
``vllm_gaudi/patches.py:5-24``, which replaces both).
How: in emulation without an accelerator, ``empty_cache``, ``synchronize`` and
``empty_host_cache`` become no-ops (what they mean on a machine without one);
on Gaudi ``empty_cache`` and ``empty_host_cache`` do: the bridge's allocator
takes freed blocks back itself, and the host has no HPU cache to empty.
Upstream change that removes it: vLLM guarding those calls with the
platform's ``empty_cache`` (as its XPU and CUDA paths do) or Habana's torch
registering a ``DeviceAllocator``.
"""

import functools
import time

import torch

from vllm_hpu import device

# In emulation, the same for the events and current stream of vLLM's expert
# load balancing (distributed/eplb): rank 0 times each rearrangement with
# ``torch.Event`` and the gloo weight exchange synchronizes
# ``torch.accelerator.current_stream()``
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
def apply_accelerator_patches() -> None:
    """Idempotent: on Gaudi, and in emulation where torch has no accelerator."""
    if device.hpu_available():
        _make_noops("empty_cache", "empty_host_cache")
    elif device.is_emulation() and not torch.accelerator.is_available():
        _make_noops("empty_cache", "synchronize", "empty_host_cache")
        torch.Event = HostEvent  # type: ignore[misc, assignment]
        torch.accelerator.current_stream = lambda device=None: HostStream()  # type: ignore[assignment, return-value]


def _make_noops(*names: str) -> None:
    for name in names:
        if hasattr(torch.accelerator, name):
            setattr(torch.accelerator, name, _noop)
