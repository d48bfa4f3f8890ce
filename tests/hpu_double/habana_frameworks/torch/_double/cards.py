"""Card acquisition: which card a process gets, and who took it.

The bridge acquires a card on the first use of the device (``hpu.init()`` from
most torch.hpu calls, or an HPU tensor) and holds it for the life of the
process (bridge v1.19.0 backend/synapse_helpers/device.cpp:415-492): the card
HLS_MODULE_ID names if it is free, else (when HABANA_VISIBLE_MODULES is unset)
or without HLS_MODULE_ID the first free visible card; "Device acquire failed."
when none is. Here a card is an ``flock`` on a file in the state folder, which
the operating system releases when the process ends.

Each attempt is appended to HPU_DOUBLE_ACQUIRE_LOG as a JSON line: pid, parent,
argv, process and thread names, the API that acquired, the card, and the
calling frames, so a test can assert which processes held a card and why.
"""

import fcntl
import json
import multiprocessing
import os
import sys
import threading
import traceback
from pathlib import Path
from typing import IO

from habana_frameworks.torch._double.config import config

_held: list[IO[str]] = []
_module_id: int | None = None
_lock = threading.Lock()


def visible_modules() -> list[int]:
    """Module ids this process may use: HABANA_VISIBLE_MODULES among the host's
    cards (the bridge's default list is 0-7, hpu/_utils.py:75-85)."""
    host = list(range(config().cards))
    raw = os.environ.get("HABANA_VISIBLE_MODULES", "")
    if not raw.strip():
        return host
    wanted = [int(part) for part in raw.split(",") if part.strip()]
    return [module for module in wanted if module in host]


def module_id() -> int | None:
    """The card this process holds, if any."""
    return _module_id


def _try_lock(module: int) -> IO[str] | None:
    folder = config().state_dir
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / f"card-{module}.lock", "w")  # noqa: SIM115 (held)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def _candidates() -> list[int]:
    visible = visible_modules()
    requested = os.environ.get("HLS_MODULE_ID", "").strip()
    if not requested:
        return visible
    by_id = [int(requested)] if int(requested) in range(config().cards) else []
    # A busy HLS_MODULE_ID falls back to any card only without
    # HABANA_VISIBLE_MODULES (device.cpp:417-419).
    if "HABANA_VISIBLE_MODULES" in os.environ:
        return by_id
    return by_id + [module for module in visible if module not in by_id]


def _caller_frames() -> list[str]:
    own = str(Path(__file__).resolve().parents[1])
    frames = [
        f"{frame.filename}:{frame.lineno} {frame.name}"
        for frame in traceback.extract_stack()
        if not frame.filename.startswith(own)
    ]
    return frames[-8:]


def _record(api: str, module: int | None) -> None:
    log = config().acquire_log
    if log is None:
        return
    entry = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "argv": list(sys.argv),
        "process": multiprocessing.current_process().name,
        "thread": threading.current_thread().name,
        "api": api,
        "module_id": module,
        "acquired": module is not None,
        "frames": _caller_frames(),
    }
    with open(log, "a") as out:
        out.write(json.dumps(entry) + "\n")


def acquire(api: str) -> int:
    """Takes a card for this process (once); raises as the bridge does when
    none is free."""
    global _module_id
    with _lock:
        if _module_id is not None:
            return _module_id
        for module in _candidates():
            handle = _try_lock(module)
            if handle is not None:
                _held.append(handle)
                _module_id = module
                _record(api, module)
                return module
        _record(api, None)
        raise RuntimeError("Device acquire failed.")


def on_first_use(why: bytes) -> int:
    """The device's callback on its first use: 0 when a card was acquired."""
    try:
        acquire(why.decode())
    except Exception:
        return 1
    return 0
