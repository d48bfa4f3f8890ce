"""A device stream: device work runs in submission order while the host goes on.
On Gaudi the bridge queues device work itself, so a submitted function runs at
once, only enqueueing. In emulation one worker thread runs them in order, so
the CPU computes step N while the host prepares N+1, and a host write to what
queued work reads shows up as a wrong token here, not first on hardware. What
a submitted function reads belongs to the stream until its future is done."""

import contextvars
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import torch

T = TypeVar("T")

_Work = Callable[[], None]


def _run_in_order(
    work: "queue.SimpleQueue[_Work | None]", num_threads: int | None
) -> None:
    """The worker thread: run each submitted function until told to stop. Its
    torch thread count is set here: an OpenMP thread count belongs to its thread."""
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    while (task := work.get()) is not None:
        task()
        del task  # hold nothing between tasks, so an idle stream can be freed


class DeviceStream:
    def __init__(self, threaded: bool, num_threads: int | None = None):
        # Seconds of device work, the stream's busy time (benchmarks/async_overlap.py).
        self.busy_s = 0.0
        self._work: queue.SimpleQueue[_Work | None] | None = None
        if threaded:
            self._work = queue.SimpleQueue()
            thread = threading.Thread(
                target=_run_in_order,
                args=(self._work, num_threads),
                name="hpu-device-stream",
                daemon=True,
            )
            thread.start()
            weakref.finalize(self, self._work.put, None)

    @property
    def is_threaded(self) -> bool:
        return self._work is not None

    def submit(self, fn: Callable[..., T], *args: Any) -> "Future[T]":
        """Queue ``fn(*args)`` behind the work submitted before it."""
        future: Future[T] = Future()
        if self._work is None:
            self._execute(future, fn, args)
        else:
            # With the submitter's context variables (dynamo's recompile limit).
            context = contextvars.copy_context()
            self._work.put(lambda: context.run(self._execute, future, fn, args))
        return future

    def synchronize(self) -> None:
        """Wait until every function submitted so far has run."""
        self.submit(lambda: None).result()

    def _execute(
        self, future: "Future[T]", fn: Callable[..., T], args: tuple[Any, ...]
    ) -> None:
        started = time.perf_counter()
        try:
            with torch.no_grad():  # grad mode is per thread
                result = fn(*args)
        except BaseException as error:  # handed to whoever waits on the future
            self.busy_s += time.perf_counter() - started
            future.set_exception(error)
        else:
            self.busy_s += time.perf_counter() - started
            future.set_result(result)
