"""Device memory in CPU emulation: a meter of what the process allocated since its
device started (``VLLM_HPU_EMULATION_MEMORY_GB`` in all), and host memory
pooled as a device allocator pools blocks."""

import ctypes
import functools
import platform
import weakref

import torch

from vllm_hpu.envs import get_envs


class EmulatedMemory:
    """A device memory of a fixed size: usage is the growth of the process's
    resident memory since the device was initialised, as everything counts on Gaudi."""

    def __init__(self) -> None:
        self.baseline = self._rss()
        # Bytes of the tensors the plugin moved to the host (sleep mode): they
        # live in the same process memory, but on Gaudi they would be host RAM.
        self.on_host = 0

    def restart(self) -> None:
        """Count from now: a later engine in this process gets an empty device."""
        self.baseline = self._rss()

    @staticmethod
    def _rss() -> int:
        import psutil

        return psutil.Process().memory_info().rss

    def total(self) -> int:
        return int(get_envs().emulation_memory_gb * (1 << 30))

    def used(self) -> int:
        return max(0, self._rss() - self.baseline - self.on_host)

    def hold_on_host(self, tensor: torch.Tensor) -> None:
        """Count ``tensor`` as host memory until it is freed."""
        nbytes = tensor.untyped_storage().nbytes()
        self.on_host += nbytes
        weakref.finalize(tensor, self._release_host, nbytes)

    def _release_host(self, nbytes: int) -> None:
        self.on_host -= nbytes

    def free(self) -> int:
        import psutil

        host_free = psutil.virtual_memory().available
        return max(0, min(self.total() - self.used(), host_free))


@functools.cache
def meter() -> EmulatedMemory:
    """This process's emulated device memory."""
    return EmulatedMemory()


# glibc's mallopt parameters, and the largest mmap threshold it accepts (64-bit).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20
_NEVER_TRIM = (1 << 31) - 1


def pool_host_memory() -> None:
    """Keep freed host memory for the next step, as a device allocator pools: glibc's
    adaptive mmap threshold made step speed depend on earlier kernels
    (docs/benchmarks.md). Tensors up to 32 MiB now come from a heap keeping 2 GiB
    freed (vLLM's CPU backend preloads tcmalloc); not off glibc, nor under
    GLIBC_TUNABLES."""
    user_tuned = "glibc.malloc." in get_envs().glibc_tunables
    if platform.libc_ver()[0] != "glibc" or user_tuned:
        return
    libc = ctypes.CDLL(None)
    libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)
    libc.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM)
    # What an engine before this one pooled goes back first: this device starts
    # empty, and what its weights take shows as growth (not as pool reuse).
    libc.malloc_trim(0)


def trim_host_heap() -> None:
    """Hand the heap's free pages back to the system (what the pooling keeps)."""
    if platform.libc_ver()[0] == "glibc":
        ctypes.CDLL(None).malloc_trim(0)
