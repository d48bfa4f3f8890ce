"""An engine that dies: the caller's exception says why, and no call waits."""

import asyncio
import atexit
import contextlib
import functools
import logging
import os
import pathlib
import shutil
import tempfile
import time
import traceback
from types import ModuleType
from typing import Any

from vllm_hpu.patches.engine_args import patch_when_imported

# Why: when the engine core or a worker fails, the caller gets "Engine core
# initialization failed. See root cause above." or EngineDeadError, the cause
# only in that process's log, which a notebook never shows. And a utility call
# already sent (reset_mm_cache after start-up, collective_rpc, sleep) waits
# forever: vLLM's monitor shuts the client down but leaves its future
# unanswered (issue 50).
# How: the caller's first config pass names a folder (VLLM_HPU_FAILURE_NOTES,
# inherited, emptied per engine, removed at exit) where vLLM's fatal records
# (EngineCore/WorkerProc "failed to start", "fatal error", "hit an exception")
# also write their exception's last line; the start-up failure and
# EngineDeadError carry those lines. MPClient.shutdown, called by the monitor
# once a core died, fails waiting utility calls with EngineDeadError.
# Upstream change that removes it: vLLM failing pending utility calls when its
# monitor finds a core dead, and handing a dead engine's exception to its client.
_FATAL_RECORDS = {
    "vllm.v1.engine.core": (
        "EngineCore failed to start",
        "EngineCore encountered a fatal error",
    ),
    "vllm.v1.executor.multiproc_executor": (
        "WorkerProc failed to start",
        "WorkerProc failed",
        "WorkerProc hit an exception",
    ),
}
_caller_notes: list[pathlib.Path] = []  # the folder this process made, once made


def prepare_failure_notes() -> None:
    """In the caller, before an engine starts: an empty folder for failure notes."""
    from vllm_hpu import envs

    if not _caller_notes:
        folder = pathlib.Path(tempfile.mkdtemp(prefix="vllm-hpu-failures-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _caller_notes.append(folder)
        envs.set_environ("VLLM_HPU_FAILURE_NOTES", str(folder))
    for note in _caller_notes[0].iterdir():
        note.unlink(missing_ok=True)


def failure_notes() -> str:
    """What this process's engines said when they failed, oldest first."""
    if not _caller_notes:
        return ""
    notes = sorted(_caller_notes[0].iterdir())  # named by the time written
    return " ".join(dict.fromkeys(n.read_text() for n in notes))


def _write_failure_note(error: BaseException) -> None:
    from vllm_hpu import envs

    with contextlib.suppress(OSError, ValueError):
        folder = envs.get_envs().failure_notes
        if folder:
            line = traceback.format_exception_only(error)[-1].strip()
            note = pathlib.Path(folder) / f"{time.time_ns()}-{os.getpid()}"
            note.write_text(line)


class _NoteFatalRecords(logging.Filter):
    def __init__(self, messages: tuple[str, ...]) -> None:
        super().__init__()
        self.messages = messages

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and str(record.msg).startswith(self.messages):
            _write_failure_note(error)
        return True


def _with_notes(message: str) -> str:
    said = failure_notes()
    return f"{message} The engine said: {said}" if said else message


def _patch_engine_dead_error(exceptions: ModuleType) -> None:
    init = exceptions.EngineDeadError.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.args = (_with_notes(self.args[0]), *self.args[1:])

    exceptions.EngineDeadError.__init__ = __init__


def _patch_startup_wait(utils: ModuleType) -> None:
    wait = utils.wait_for_engine_startup

    @functools.wraps(wait)
    def wait_for_engine_startup(*args: Any, **kwargs: Any) -> Any:
        try:
            return wait(*args, **kwargs)
        except RuntimeError as error:
            said = _with_notes(str(error))
            if said == str(error):
                raise
            raise RuntimeError(said) from error

    utils.wait_for_engine_startup = wait_for_engine_startup  # type: ignore[attr-defined]


def _fail_pending_calls(pending: dict[int, Any]) -> None:

    for call_id in list(pending):
        future = pending.pop(call_id, None)
        if future is None or future.done():
            continue
        if isinstance(future, asyncio.Future):
            with contextlib.suppress(RuntimeError):  # its loop has closed
                loop = future.get_loop()
                loop.call_soon_threadsafe(_fail_unless_done, future)
        else:
            _fail_unless_done(future)


def _fail_unless_done(future: Any) -> None:
    from vllm.v1.engine.exceptions import EngineDeadError

    if not future.done():
        future.set_exception(EngineDeadError())


def _patch_client_shutdown(core_client: ModuleType) -> None:
    shutdown = core_client.MPClient.shutdown

    @functools.wraps(shutdown)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            shutdown(self, *args, **kwargs)
        finally:
            _fail_pending_calls(getattr(self, "utility_results", {}))

    core_client.MPClient.shutdown = wrapped


_ENGINE_FAILURE_PATCHES = {
    "vllm.v1.engine.exceptions": _patch_engine_dead_error,
    "vllm.v1.engine.utils": _patch_startup_wait,
    "vllm.v1.engine.core_client": _patch_client_shutdown,
}


@functools.cache
def report_engine_failures() -> None:
    """Idempotent; the platform entry point calls it in every process."""
    for name, messages in _FATAL_RECORDS.items():
        logging.getLogger(name).addFilter(_NoteFatalRecords(messages))
    for name, patch in _ENGINE_FAILURE_PATCHES.items():
        patch_when_imported(name, patch)
