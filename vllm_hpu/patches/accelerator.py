"""torch.accelerator's cache calls where they fail: CPU emulation and Gaudi.

Why: vLLM's loader and shutdown call ``torch.accelerator.empty_cache`` (and
``empty_host_cache``) unconditionally, except on its own CPU platform. A
CPU-only torch raises "Cannot access accelerator device when none is
available"; Habana's "Allocator for hpu is not a DeviceAllocator", with no
``empty_host_cache`` hook (vllm-gaudi 091bbad patches.py:5-24).
How: in emulation ``empty_cache``, ``synchronize`` and ``empty_host_cache``
are no-ops; on Gaudi the cache calls are (the bridge frees blocks itself);
``get_memory_info`` (free, total) reads the device's meter on both.
Upstream change that removes it: vLLM guarding them with the platform's
``empty_cache``, or Habana's torch registering a ``DeviceAllocator``."""

import functools
import time

import torch

from vllm_hpu import device

# In emulation, likewise for EPLB's ``torch.Event`` timing and the gloo
# exchange's ``torch.accelerator.current_stream()``, which raise on a CPU-only
# torch ("cpu backend doesn't support events"): an event is a host timestamp,
# the stream has nothing to wait for. Upstream change that removes it: the
# same guard there.


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
    # Gemma 4's image encoder sizes its batches by free memory.
    torch.accelerator.get_memory_info = lambda index=None: device.mem_get_info()  # type: ignore[assignment]
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
