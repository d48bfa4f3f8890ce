"""A step trace in Chrome trace JSON (VLLM_PROFILER_ENABLED): spans (prepare,
forward, sample) written at shutdown to
``VLLM_HPU_PROFILE_DIR/trace_rank<N>_<pid>.json`` for Perfetto."""

import contextlib
import json
import os
import pathlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from vllm.logger import init_logger

logger = init_logger("vllm.hpu.profiler")


class StepProfiler:
    """Complete ("X") events with microsecond timestamps; a no-op when disabled."""

    def __init__(self, enabled: bool, folder: str, rank: int = 0) -> None:
        self.enabled = enabled
        self.path = pathlib.Path(folder) / f"trace_rank{rank}_{os.getpid()}.json"
        self.rank = rank
        self.events: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def span(self, name: str, **args: Any) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        started = time.perf_counter_ns()
        try:
            yield
        finally:
            ended = time.perf_counter_ns()
            self.events.append(
                {
                    "name": name,
                    "cat": "step",
                    "ph": "X",
                    "ts": started / 1e3,
                    "dur": (ended - started) / 1e3,
                    "pid": self.rank,
                    "tid": threading.get_ident(),
                    "args": {key: str(value) for key, value in args.items()},
                }
            )

    def write(self) -> pathlib.Path | None:
        """Write the trace; returns where, or None when nothing was recorded."""
        if not self.enabled or not self.events:
            return None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        trace = {"traceEvents": self.events, "displayTimeUnit": "ms"}
        self.path.write_text(json.dumps(trace))
        logger.info("Wrote a step trace of %d spans to %s", len(self.events), self.path)
        return self.path
