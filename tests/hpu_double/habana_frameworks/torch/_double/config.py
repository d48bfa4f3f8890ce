"""The double's settings, read once from the environment.

HPU_DOUBLE_DEVICE     gaudi2 (default) or gaudi3: the card generation, its
                      device type, name, memory and fp8 range.
HPU_DOUBLE_CARDS      cards on the emulated host (default 8).
HPU_DOUBLE_MEMORY_MIB device memory of each card (default 4096; a real Gaudi2
                      has 96 GiB, far beyond what a CPU test can back).
HPU_DOUBLE_STATE_DIR  where cards are locked while a process holds one (default:
                      a folder per user and process group under the temp dir).
HPU_DOUBLE_ACQUIRE_LOG  a file that gets one JSON line per card acquisition.
HPU_DOUBLE_BUILD_DIR  where the emulated device is compiled (default
                      ~/.cache/vllm-hpu-double).
HPU_DOUBLE_TORCH_BUILT_FOR  the torch major.minor the double stands as built for
                      (default: the installed torch's), to model a torch swap.
The bridge's own variables keep their names: PT_HPU_LAZY_MODE,
PT_HPU_ENABLE_LAZY_COLLECTIVES, HABANA_VISIBLE_MODULES, HLS_MODULE_ID.
"""

import dataclasses
import functools
import os
import tempfile
from pathlib import Path

MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Generation:
    name: str  # torch.hpu.get_device_name()
    device_type: int  # synapse's synDeviceType
    fp8_e4m3_max: float  # largest finite e4m3 value the card computes with


# synDeviceType values: synapse_common_types.h (synDeviceGaudi2 = 4, then
# synDeviceGaudi3). Gaudi2's e4m3 reserves the top exponent (max 240, as
# vllm-gaudi's FP8_MAX on Gaudi2, extension/ops.py:25-30); Gaudi3 is OCP e4m3fn.
GENERATIONS = {
    "gaudi2": Generation("GAUDI2", 4, 240.0),
    "gaudi3": Generation("GAUDI3", 5, 448.0),
}


@dataclasses.dataclass(frozen=True)
class DoubleConfig:
    generation: Generation
    cards: int
    memory_bytes: int
    state_dir: Path
    acquire_log: Path | None
    build_dir: Path
    torch_built_for: str | None


def _positive(name: str, default: int) -> int:
    raw = os.environ.get(name, str(default))
    if not raw.isdigit() or int(raw) <= 0:
        raise ValueError(f"{name}={raw!r}: a positive integer is expected")
    return int(raw)


def _generation() -> Generation:
    raw = os.environ.get("HPU_DOUBLE_DEVICE", "gaudi2").lower()
    if raw not in GENERATIONS:
        raise ValueError(f"HPU_DOUBLE_DEVICE={raw!r}: one of {sorted(GENERATIONS)}")
    return GENERATIONS[raw]


def _default_state_dir() -> Path:
    owner = f"{os.getuid()}-{os.getpgrp()}"
    return Path(tempfile.gettempdir()) / f"hpu-double-{owner}"


@functools.cache
def config() -> DoubleConfig:
    log = os.environ.get("HPU_DOUBLE_ACQUIRE_LOG")
    build = os.environ.get("HPU_DOUBLE_BUILD_DIR")
    state = os.environ.get("HPU_DOUBLE_STATE_DIR")
    return DoubleConfig(
        generation=_generation(),
        cards=_positive("HPU_DOUBLE_CARDS", 8),
        memory_bytes=_positive("HPU_DOUBLE_MEMORY_MIB", 4096) * MIB,
        state_dir=Path(state) if state else _default_state_dir(),
        acquire_log=Path(log) if log else None,
        build_dir=Path(build) if build else Path.home() / ".cache/vllm-hpu-double",
        torch_built_for=os.environ.get("HPU_DOUBLE_TORCH_BUILT_FOR"),
    )


def lazy_collectives() -> bool:
    """PT_HPU_ENABLE_LAZY_COLLECTIVES as the bridge reads it
    (distributed/hccl/__init__.py:12)."""
    raw = os.environ.get("PT_HPU_ENABLE_LAZY_COLLECTIVES", "False")
    return raw.lower() in ("true", "1")
