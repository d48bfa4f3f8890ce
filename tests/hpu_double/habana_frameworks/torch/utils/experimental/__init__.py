"""habana_frameworks.torch.utils.experimental: the device type (bridge v1.19.0
utils/experimental/__init__.py:42-47 and csrc/bindings.cpp:78-124) and the
quantization state Intel Neural Compressor sets before it converts a model on a
Gaudi (INC 3.8.1 ``_core/utils.py:96-107``, its release for Gaudi 1.24): the
scale attributes of a later bridge (ankurneog/gaudi-pytorch-bridge@ea38cef) and
the dynamic-quantization flag, whose bridge source is not published (see
bridge_signatures.json). The double keeps both for tests to read."""

import enum
from typing import Any

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


# What INC last set: "is_dynamic_quantization", "is_hw_aligned", "scale_hash_id".
quantization_state: dict[str, Any] = {}


def _set_is_dynamic_quantization(is_dynamic_quantization: bool) -> None:
    """Whether INC quantizes activations per call (its ``dynamic_quantization``)."""
    quantization_state["is_dynamic_quantization"] = bool(is_dynamic_quantization)


def _set_scale_attributes(is_hw_aligned: bool, scale_hash_id: int) -> None:
    """Whether every scale is aligned to the hardware's steps, and an id of the
    scaling method, for run-time scale patching; initializes the device first."""
    from habana_frameworks.torch import hpu

    hpu.init()
    quantization_state.update(is_hw_aligned=is_hw_aligned, scale_hash_id=scale_hash_id)
