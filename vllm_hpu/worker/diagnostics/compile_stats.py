"""Graph compilations per step (VLLM_HPU_LOG_STEP_GRAPH_COMPILATION[_ALL]): after
warmup none should compile inside the bucket ranges; counts via ``device.py``."""

import contextlib
from collections.abc import Iterator

from vllm.logger import init_logger

from vllm_hpu import device

logger = init_logger("vllm.hpu.compile_stats")


class StepCompilations:
    def __init__(self, log_nonzero: bool, log_all: bool) -> None:
        self.log_nonzero = log_nonzero or log_all
        self.log_all = log_all
        self.num_steps = 0
        self.total = 0  # compilations in the steps counted so far

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Count the compilations of one engine step, and log them as asked."""
        before = device.graph_compilations()
        yield
        count = device.graph_compilations() - before
        self.num_steps += 1
        self.total += count
        if self.log_all or (self.log_nonzero and count):
            logger.info(
                "Step %d compiled %d graph(s); %d in %d steps so far",
                self.num_steps,
                count,
                self.total,
                self.num_steps,
            )
