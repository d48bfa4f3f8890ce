"""A dead engine's cause reaches its caller, and no utility call waits on it
(patches/engine_failures.py; end to end: tests/e2e/test_failures.py)."""

import asyncio
import logging
import threading
from concurrent.futures import Future

import pytest

from vllm_hpu import envs
from vllm_hpu.patches import engine_failures


def test_pending_utility_calls_fail_when_the_client_shuts_down():
    from vllm.v1.engine.exceptions import EngineDeadError

    waiting, answered = Future(), Future()
    answered.set_result("done")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        waiting_async = asyncio.run_coroutine_threadsafe(_future(), loop).result()
        pending = {1: waiting, 2: answered, 3: waiting_async}
        engine_failures._fail_pending_calls(pending)
        assert pending == {}
        with pytest.raises(EngineDeadError):
            waiting.result(timeout=5)
        assert answered.result() == "done"
        wrapped = asyncio.run_coroutine_threadsafe(_wait(waiting_async), loop)
        with pytest.raises(EngineDeadError):
            wrapped.result(timeout=5)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)


async def _future() -> asyncio.Future:
    return asyncio.get_running_loop().create_future()


async def _wait(future: asyncio.Future) -> object:
    return await future


def test_a_fatal_engine_record_names_its_cause_in_engine_dead_error(monkeypatch):
    from vllm.v1.engine.exceptions import EngineDeadError

    monkeypatch.setattr(engine_failures, "_caller_notes", [])
    monkeypatch.delenv("VLLM_HPU_FAILURE_NOTES", raising=False)
    engine_failures.report_engine_failures()
    engine_failures.prepare_failure_notes()
    envs.get_envs.cache_clear()  # as a process the caller started reads it
    try:
        assert "said" not in str(EngineDeadError())
        try:
            raise ValueError("the KV cache does not fit")
        except ValueError:
            logging.getLogger("vllm.v1.engine.core").exception(
                "EngineCore failed to start."
            )
        said = "The engine said: ValueError: the KV cache does not fit"
        assert str(EngineDeadError()).endswith(said)
        engine_failures.prepare_failure_notes()  # the next engine starts with none
        assert "said" not in str(EngineDeadError())
    finally:
        envs.get_envs.cache_clear()
