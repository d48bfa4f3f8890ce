"""habana_frameworks.torch.utils.experimental: the device type (bridge v1.19.0
utils/experimental/__init__.py:42-47 and csrc/bindings.cpp:78-124)."""

import enum

from habana_frameworks.torch._double.config import config


class synDeviceType(enum.IntEnum):
    """Synapse's device types (synapse_common_types.h); an int enum, as the
    bridge's pybind enum compares equal to the int _get_device_type returns."""

    synDeviceGoya2 = 1
    synDeviceGaudi = 2
    synDeviceGaudi2 = 4
    synDeviceGaudi3 = 5
    synDeviceEmulator = 6
    synDeviceTypeInvalid = 7
    synDeviceTypeSize = 8


synDeviceGaudi = synDeviceType.synDeviceGaudi
synDeviceGaudi2 = synDeviceType.synDeviceGaudi2
synDeviceGaudi3 = synDeviceType.synDeviceGaudi3


def _get_device_type() -> int:
    """The card type as synapse numbers it; asks no card (device.cpp:573-589)."""
    return config().generation.device_type


def _is_fp16_supported() -> bool:
    return _get_device_type() != synDeviceType.synDeviceGaudi
