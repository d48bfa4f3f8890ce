"""Device memory statistics (bridge v1.19.0 hpu/memory.py): every call
initializes the device; ``mem_get_info`` is (Limit - InUse, Limit)."""

from typing import Any

from habana_frameworks.torch._double import native
from habana_frameworks.torch.hpu._utils import _get_device_index

__all__ = [
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
]


def _checked_device(device: Any, api: str) -> int:
    import habana_frameworks.torch.hpu as hpu

    hpu._lazy_init(api)
    index = _get_device_index(device, optional=True)
    if index < 0 or index >= hpu.device_count():
        raise AssertionError("Invalid device id")
    return index


def memory_stats(device: Any = None) -> dict[str, Any]:
    _checked_device(device, "torch.hpu.memory_stats")
    return native.memory_stats()


def max_memory_allocated(device: Any = None) -> int:
    _checked_device(device, "torch.hpu.max_memory_allocated")
    return native.memory_stats()["MaxInUse"]


def memory_allocated(device: Any = None) -> int:
    _checked_device(device, "torch.hpu.memory_allocated")
    return native.memory_stats()["InUse"]


def reset_peak_memory_stats(device: Any = None) -> None:
    _checked_device(device, "torch.hpu.reset_peak_memory_stats")
    native.reset_peak_memory()


def reset_accumulated_memory_stats(device: Any = None) -> None:
    _checked_device(device, "torch.hpu.reset_accumulated_memory_stats")
    native.reset_accumulated_memory()


def memory_reserved(device: Any = None) -> int:
    return memory_stats(device)["Limit"]


def max_memory_reserved(device: Any = None) -> int:
    return memory_stats(device)["Limit"]


def mem_get_info(device: Any = None) -> tuple[int, int]:
    stats = memory_stats(device)
    return (stats["Limit"] - stats["InUse"], stats["Limit"])
