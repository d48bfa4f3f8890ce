"""torch.hpu: the bridge's device module (bridge v1.19.0 hpu/__init__.py).

``is_available`` and ``device_count`` ask no card; every other device call
initializes the device, which acquires a card for the process (``_lazy_init``,
hpu/__init__.py:54-91), as do the memory and RNG-state calls.
"""

import os
import threading
from typing import Any

from habana_frameworks.torch._double import cards, config, native
from habana_frameworks.torch.hpu._utils import (
    HABANA_VISIBLE_MODULES_VAR,
    HLS_MODULE_ID_VAR,
    _get_available_modules_from_environ,
    _get_device_index,
    _get_module_id_from_environ,
)
from habana_frameworks.torch.hpu.memory import *  # noqa: F403
from habana_frameworks.torch.hpu.metrics import *  # noqa: F403
from habana_frameworks.torch.hpu.random import *  # noqa: F403
from habana_frameworks.torch.hpu.streams import *  # noqa: F403
from habana_frameworks.torch.utils.internal import is_lazy

if is_lazy():
    from habana_frameworks.torch.hpu.graphs import *  # noqa: F403

_initialized = False
_initialization_lock = threading.Lock()
_autocast_enabled = False


def _lazy_init(api: str = "torch.hpu.init") -> None:
    """Initializes the device, acquiring a card (``_hpu_C.init()``)."""
    global _initialized
    if _initialized:
        return
    with _initialization_lock:
        if not _initialized:
            native.acquire(api)
            _initialized = True


def init() -> None:
    _lazy_init("torch.hpu.init")


def is_initialized() -> bool:
    return _initialized


def is_available() -> bool:
    """Whether a card is present; acquires none (hpu/__init__.py:99-105)."""
    return device_count() > 0


def device_count() -> int:
    """Cards present and visible; acquires none."""
    return len(cards.visible_modules())


def get_device_name(device: Any = None) -> str:
    if not is_available():
        return ""
    _lazy_init("torch.hpu.get_device_name")
    index = _get_device_index(device, optional=True)
    if index < 0 or index >= device_count():
        raise AssertionError("Invalid device id")
    return config.config().generation.name


def current_device() -> int:
    _lazy_init("torch.hpu.current_device")
    return 0


def synchronize() -> None:
    """Waits for queued device work; the emulated device runs it inline."""
    _lazy_init("torch.hpu.synchronize")


def is_bf16_supported() -> bool:
    return is_available()


def get_device_capability(device: Any = None) -> str:
    if not is_available():
        return ""
    _lazy_init("torch.hpu.get_device_capability")
    index = _get_device_index(device, optional=True)
    if index < 0 or index >= device_count():
        raise AssertionError("Invalid device id")
    return config.config().generation.name


def get_device_properties(device: Any = None) -> str:
    if not is_available():
        return ""
    _lazy_init("torch.hpu.get_device_properties")
    index = _get_device_index(device, optional=True)
    if index < 0 or index >= device_count():
        raise AssertionError("Invalid device id")
    generation = config.config().generation
    return f"(type={generation.name}, dramSize={config.config().memory_bytes})"


def set_device(device: Any) -> None:
    """Selects the card (hpu/__init__.py:321-358): a device without an index
    means the current one, which initializes the device first."""
    device_idx = _get_device_index(device, optional=True)
    available_modules = _get_available_modules_from_environ()
    if device_idx not in available_modules and device_idx > len(available_modules):
        raise AssertionError(
            f"Trying to open device with idx={device_idx} when only "
            f"{available_modules} are avaliable)"
        )
    current_module_id = _get_module_id_from_environ()
    if current_module_id >= 0:
        for index in range(device_count()):
            if available_modules[index] == current_module_id:
                device_idx = index
                break
        assert available_modules[device_idx] == current_module_id, (
            f"Requested module_id={available_modules[device_idx]} is different "
            f"from current_module_id={current_module_id} which was previously set."
        )
    if (
        current_module_id == -1
        and HABANA_VISIBLE_MODULES_VAR not in os.environ
        and device_count() < 8
    ):
        assert device_idx == 0, (
            f"As {HABANA_VISIBLE_MODULES_VAR} is not provided, the only supported "
            "device idx is 0."
        )
    else:
        os.environ[HLS_MODULE_ID_VAR] = str(available_modules[device_idx])
    set_device.current_device_idx = device_idx  # type: ignore[attr-defined]


set_device.current_device_idx = -1  # type: ignore[attr-defined]


class device:
    """Context manager selecting a device (hpu/__init__.py:364-387)."""

    def __init__(self, device: Any) -> None:
        index = _get_device_index(device, optional=True)
        env_index = _get_module_id_from_environ()
        if index != 0 and index != env_index:
            raise AssertionError(
                f"Requested device_id={index} is different from "
                f"env_device_id={env_index}"
            )
        self.idx = env_index
        self.prev_idx = -1

    def __enter__(self) -> None:
        self.prev_idx = set_device.current_device_idx  # type: ignore[attr-defined]
        if self.idx != -1 and self.idx != self.prev_idx:
            set_device(self.idx)

    def __exit__(self, *exc: object) -> bool:
        if self.prev_idx != self.idx and self.prev_idx != -1:
            set_device(self.idx)
        return False


def set_autocast_hpu_enabled(enabled: bool) -> None:
    global _autocast_enabled
    _autocast_enabled = bool(enabled)


def is_autocast_hpu_enabled() -> bool:
    return _autocast_enabled
