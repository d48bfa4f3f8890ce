"""No triton in a process of CPU emulation."""

import logging
import sys

# triton on a CPU run.
# Why: torch's Dynamo imports triton whenever it is installed
# (``torch.utils._triton.has_triton_package``, at import; vLLM imports Dynamo in
# ``vllm/env_override.py``), and xgrammar, which vLLM's structured output needs,
# requires the package. On the CPU nothing can run it (this triton has no CPU
# backend, and vLLM turns triton off without an active driver), yet its nanobind
# extension printed about 30 lines at the exit of every engine process
# ("nanobind: leaked 64 types! ... likely caused by a reference counting issue"):
# engine and worker processes exit without collecting their heap
# (worker/hpu_worker.py ``_exit_quickly``, 3-5 s otherwise), so its
# types are still alive when nanobind checks.
# How: at interpreter start (the set-up's ``.pth`` file imports
# ``interpreter_start``), with VLLM_HPU_EMULATION=1 and triton not imported yet,
# ``import triton`` finds the package absent, as Python answers a blocked import
# (a ``None`` entry in ``sys.modules``): torch, vLLM and xgrammar then take their
# paths without it (Inductor's CPU code generation, xgrammar's CPU bitmask
# kernel). The two lines saying so at import are dropped: torch's "Triton not
# available", and vLLM's "Failed to import Triton kernels" (it finds its vendored
# triton_kernels, which needs triton). On Gaudi nothing changes.
# Upstream change that removes it: torch importing triton only to compile a triton
# kernel, or triton switching nanobind's leak warnings off at exit.
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
