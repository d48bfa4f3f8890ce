"""An engine core stopped at once still gets time to exit before it is killed."""

import functools
from types import ModuleType
from typing import Any

from vllm_hpu.patches.engine_args import patch_when_imported

# Engine processes stopped with --shutdown-timeout 0.
# Why: ``vllm serve`` stops its engine with vLLM's default --shutdown-timeout 0
# (in-flight requests aborted at once), and vLLM's process manager then uses the
# same 0 as the engine core's time to exit after its SIGTERM: it kills the core
# at once, with two warnings ("force killing remaining processes") and Python's
# resource tracker reporting the core's semaphores as leaked. vLLM gives ROCm a
# cleanup grace for exactly this case (``get_engine_process_shutdown_timeout``),
# no other platform. The plugin's engine core exits within about a second of its
# SIGTERM (worker/hpu_worker.py skips the collection of its heap at exit).
# Given that time, ``vllm serve``'s AsyncLLM logged its own shutdown as a failure:
# it stops the engine from a worker thread, closes the client's sockets, and
# only then cancels its output handler, which meanwhile reads the closed queue
# as the engine's death ("AsyncLLM output_handler failed ... EngineDeadError").
# How: where the process manager is asked to stop engine processes with no time
# at all, it waits up to vLLM's own best-effort window (5 s) for them to exit;
# requests are still aborted at once, and a core that exits sooner is not waited
# for. An AsyncLLM stopped with no time for requests (nothing left to drain)
# cancels its output handler first.
# Upstream change that removes it: vLLM's cleanup grace for every platform, or
# one the platform can declare; AsyncLLM cancelling its output handler before
# closing the client when it aborts its requests.
EXIT_GRACE_S = 5.0


def _patch_process_shutdown(engine_utils: ModuleType) -> None:
    shutdown = engine_utils.shutdown  # type: ignore[attr-defined]

    @functools.wraps(shutdown)
    def with_grace(procs: Any, timeout: float | None = None) -> None:
        shutdown(procs, timeout=EXIT_GRACE_S if timeout == 0 else timeout)

    engine_utils.shutdown = with_grace  # type: ignore[attr-defined]


def _patch_async_llm_shutdown(async_llm: ModuleType) -> None:
    from vllm.utils.async_utils import cancel_task_threadsafe

    shutdown = async_llm.AsyncLLM.shutdown

    @functools.wraps(shutdown)
    def handler_first(self: Any, timeout: float | None = None) -> None:
        handler = getattr(self, "output_handler", None)
        if timeout == 0 and handler is not None:
            cancel_task_threadsafe(handler)
        shutdown(self, timeout)

    async_llm.AsyncLLM.shutdown = handler_first


@functools.cache
def give_engines_time_to_exit() -> None:
    """Idempotent; the platform entry point calls it."""
    patch_when_imported("vllm.v1.engine.utils", _patch_process_shutdown)
    patch_when_imported("vllm.v1.engine.async_llm", _patch_async_llm_shutdown)
