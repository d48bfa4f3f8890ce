"""Operators that fell back to the host per step (VLLM_HPU_LOG_STEP_CPU_FALLBACKS
[_ALL]), from the bridge's counters; in emulation said once, not counted."""

import contextlib
from collections.abc import Iterator

from vllm.logger import init_logger

from vllm_hpu import device

logger = init_logger("vllm.hpu.fallback_stats")


def new_fallbacks(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Per operator, the fallbacks counted between two readings."""
    grown = {op: n - before.get(op, 0) for op, n in after.items()}
    return {op: n for op, n in sorted(grown.items()) if n > 0}


class StepFallbacks:
    def __init__(self, log_nonzero: bool, log_all: bool) -> None:
        self.log_nonzero = log_nonzero or log_all
        self.log_all = log_all
        self.num_steps = 0
        self.counted = self.log_nonzero and device.cpu_fallbacks() is not None
        if self.log_nonzero and not self.counted:
            logger.info(
                "VLLM_HPU_LOG_STEP_CPU_FALLBACKS: in CPU emulation every operator "
                "runs on the host, so no step has fallbacks to log."
            )

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Count the host fallbacks of one engine step, and log them as asked."""
        if not self.counted:
            yield
            return
        before = device.cpu_fallbacks() or {}
        yield
        fallbacks = new_fallbacks(before, device.cpu_fallbacks() or {})
        self.num_steps += 1
        if self.log_all or fallbacks:
            logger.info(
                "Step %d: %d CPU fallback(s) %s",
                self.num_steps,
                sum(fallbacks.values()),
                fallbacks,
            )
