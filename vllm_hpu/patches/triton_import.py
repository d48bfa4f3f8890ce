"""No triton in a process of CPU emulation."""

import logging
import sys

# triton on a CPU run.
# Why: Dynamo imports triton whenever installed (``has_triton_package``; vLLM
# imports Dynamo in ``vllm/env_override.py``) and xgrammar requires it. Nothing
# runs it on the CPU, yet its nanobind extension printed ~30 lines ("nanobind:
# leaked 64 types!") at every engine exit, since our processes exit without
# collecting their heap (worker/hpu_worker.py ``_exit_quickly``).
# How: at interpreter start (the ``.pth`` imports ``interpreter_start``), with
# VLLM_HPU_EMULATION=1 and triton not yet imported, a ``None`` entry in
# ``sys.modules`` blocks it: torch, vLLM and xgrammar take their CPU paths.
# torch's "Triton not available" and vLLM's "Failed to import Triton kernels"
# are dropped. On Gaudi nothing changes.
# Upstream change that removes it: torch importing triton only to compile a
# kernel, or triton silencing nanobind's leak warnings at exit.
TRITON = "triton"
# The loggers that say triton is absent, and how their records begin.
_SAY_TRITON_IS_ABSENT = {
    "torch._library.triton": "Triton not available",
    **dict.fromkeys(
        (
            "vllm.model_executor.layers.fused_moe.config",
            "vllm.model_executor.layers.fused_moe.oracle.mxfp4",
            "vllm.model_executor.layers.fused_moe.experts.gpt_oss_triton_kernels_moe",
        ),
        "Failed to import Triton kernels",
    ),
}


class _DropAbsentTriton(logging.Filter):
    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        hidden = TRITON in sys.modules and sys.modules[TRITON] is None
        return not (hidden and str(record.msg).startswith(self.start))


def hide_triton() -> None:
    """Call at interpreter start (see above); once per process."""
    from vllm_hpu import envs

    if envs.emulation_at_start() and TRITON not in sys.modules:
        sys.modules[TRITON] = None  # type: ignore[assignment]
        for name, start in _SAY_TRITON_IS_ABSENT.items():
            logging.getLogger(name).addFilter(_DropAbsentTriton(start))
