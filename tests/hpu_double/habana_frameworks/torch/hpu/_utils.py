"""Device indices and module ids (bridge v1.19.0 hpu/_utils.py)."""

import os
from typing import Any

HABANA_VISIBLE_MODULES_VAR = "HABANA_VISIBLE_MODULES"
HLS_MODULE_ID_VAR = "HLS_MODULE_ID"


def _get_device_index(
    device: Any, optional: bool = False, allow_cpu: bool = False
) -> int:
    """The index of ``device`` (a torch.device, "hpu[:n]" or an int); without an
    index, the current device when ``optional`` (which initializes the device)."""
    import torch

    import habana_frameworks.torch.hpu as hpu

    if isinstance(device, str):
        device = torch.device(device)
    index = None
    if isinstance(device, torch.device):
        if allow_cpu:
            if device.type not in ("hpu", "cpu"):
                raise ValueError(f"Expected a hpu or cpu device, but got: {device}")
        elif device.type != "hpu":
            raise ValueError(f"Expected a hpu device, but got: {device}")
        index = -1 if device.type == "cpu" else device.index
    if isinstance(device, int):
        index = device
    if index is None:
        if not optional:
            raise ValueError(
                "Expected a torch.device with a specified index or an integer, "
                f"but got:{device}"
            )
        index = hpu.current_device()
    return index


def _get_module_id_from_environ() -> int:
    raw = os.getenv(HLS_MODULE_ID_VAR, "")
    return int(raw) if raw else -1


def _get_available_modules_from_environ() -> list[int]:
    raw = os.getenv(HABANA_VISIBLE_MODULES_VAR, default="0,1,2,3,4,5,6,7")
    modules = [int(part) for part in raw.split(",") if part.strip()]
    if not modules:
        return list(range(8))
    assert 0 < len(modules) <= 8, (
        f"{HABANA_VISIBLE_MODULES_VAR} does not have valid value."
    )
    return modules
