"""An engine core stopped at once still gets time to exit before it is killed."""

import functools
from types import ModuleType
from typing import Any

from vllm_hpu.patches.engine_args import patch_when_imported

# Engine processes stopped with --shutdown-timeout 0.
# Why: with vLLM's default --shutdown-timeout 0, the process manager kills the
# engine core at once after SIGTERM ("force killing remaining processes", its
# semaphores reported leaked); vLLM gives only ROCm a cleanup grace
# (``get_engine_process_shutdown_timeout``). Our core exits within ~1 s. Given
# that time, AsyncLLM closed the client's sockets before cancelling its output
# handler, which logged "output_handler failed ... EngineDeadError".
# How: a zero timeout waits up to vLLM's best-effort window (5 s) for engine
# processes (requests still aborted at once); AsyncLLM stopped with no time
# cancels its output handler first.
# Upstream change that removes it: a cleanup grace for every platform (or one
# it can declare); AsyncLLM cancelling its handler before closing the client.
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
