"""Builds and loads the emulated HPU device (csrc/hpu_device.cpp) and wraps its
C interface.

The library is compiled once per source, torch and Python version, with the C++
compiler torch's headers need (``CXX``, else ``c++``), into the build folder of
``config.py``; concurrent processes wait for one compile.
"""

import ctypes
import fcntl
import hashlib
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import torch

from habana_frameworks.torch._double.config import Generation, config

SOURCE = Path(__file__).resolve().parents[3] / "csrc" / "hpu_device.cpp"
MEMORY_STAT_NAMES = (
    "Limit",
    "InUse",
    "MaxInUse",
    "NumAllocs",
    "NumFrees",
    "ActiveAllocs",
    "MaxAllocSize",
)
AcquireCallback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p)

_library: ctypes.CDLL | None = None
_callback_keepalive: list[object] = []


def _build_key() -> str:
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(torch.__version__.encode())
    digest.update(sys.version.encode())
    return digest.hexdigest()[:16]


def _compile(target: Path) -> None:
    torch_dir = Path(torch.__file__).resolve().parent
    include = torch_dir / "include"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    command = [
        os.environ.get("CXX", "c++"),
        "-O2",
        "-shared",
        "-fPIC",
        "-std=c++17",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-I{include}",
        f"-I{include / 'torch/csrc/api/include'}",
        f"-I{sysconfig.get_paths()['include']}",
        str(SOURCE),
        f"-L{torch_dir / 'lib'}",
        f"-Wl,-rpath,{torch_dir / 'lib'}",
        "-lc10",
        "-ltorch_cpu",
        "-ltorch",
        "-o",
        str(target),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"HPU double: compiling {SOURCE} failed:\n{result.stderr[-4000:]}"
        )


def library_path() -> Path:
    """The compiled library, compiling it first if needed."""
    folder = config().build_dir
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"hpu_device-{_build_key()}.so"
    if target.exists():
        return target
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            partial = target.with_suffix(f".{os.getpid()}.tmp")
            _compile(partial)
            os.replace(partial, target)
    return target


def load(lazy: bool, lazy_collectives: bool, acquire: object) -> ctypes.CDLL:
    """Loads the device into this process (once) and configures it."""
    global _library
    if _library is None:
        _library = ctypes.CDLL(str(library_path()), mode=ctypes.RTLD_GLOBAL)
        callback = AcquireCallback(acquire)
        _callback_keepalive.append(callback)
        _library.hpu_double_set_acquire_callback(callback)
        settings = config()
        _library.hpu_double_configure(
            ctypes.c_int(visible_card_count()),
            ctypes.c_int64(settings.memory_bytes),
            ctypes.c_int(int(lazy)),
            ctypes.c_int(int(lazy_collectives)),
            ctypes.c_double(_gaudi2_fp8_max(settings.generation)),
        )
    return _library


def _gaudi2_fp8_max(generation: Generation) -> float:
    """The e4m3 limit the device enforces, 0 where it is OCP e4m3fn's."""
    ocp_max = float(torch.finfo(torch.float8_e4m3fn).max)
    return 0.0 if generation.fp8_e4m3_max == ocp_max else generation.fp8_e4m3_max


def lib() -> ctypes.CDLL:
    if _library is None:
        raise RuntimeError("HPU double: habana_frameworks.torch is not imported")
    return _library


def visible_card_count() -> int:
    """Cards this process sees: HABANA_VISIBLE_MODULES among the host's."""
    from habana_frameworks.torch._double import cards

    return len(cards.visible_modules())


def acquire(api: str) -> None:
    """Acquires a card for this process now, as the bridge's hpu.init() does."""
    if lib().hpu_double_acquire(api.encode()) != 0:
        raise RuntimeError("Device acquire failed.")


def is_acquired() -> bool:
    return bool(lib().hpu_double_is_acquired())


def memory_stats() -> dict[str, int]:
    values = (ctypes.c_int64 * len(MEMORY_STAT_NAMES))()
    lib().hpu_double_memory_stats(values)
    return dict(zip(MEMORY_STAT_NAMES, values, strict=True))


def reset_peak_memory() -> None:
    lib().hpu_double_reset_peak_memory()


def reset_accumulated_memory() -> None:
    lib().hpu_double_reset_accumulated_memory()


def mark_step() -> None:
    lib().hpu_double_mark_step()


def graph_stats() -> dict[str, int]:
    values = (ctypes.c_int64 * 3)()
    lib().hpu_double_graph_stats(values)
    return {"compilations": values[0], "steps": values[1], "pending_ops": values[2]}


def count_compilation() -> None:
    lib().hpu_double_count_compilation()


def pause_counting(pause: bool) -> None:
    lib().hpu_double_pause_counting(ctypes.c_int(int(pause)))


def set_capturing(capturing: bool) -> None:
    lib().hpu_double_set_capturing(ctypes.c_int(int(capturing)))


def note_operator(name: str) -> None:
    lib().hpu_double_note_operator(name.encode())
