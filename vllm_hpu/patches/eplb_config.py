"""``--enable-eplb`` on the HPU platform, its config completed as vLLM would on CUDA.

Why: vLLM 0.32's ``ParallelConfig`` validator refuses EPLB off CUDA, ROCm and
XPU before a platform hook runs; the plugin runs it (ops/fused_moe.py,
worker/capabilities/eplb.py, vLLM's EplbState).
How: EPLB is off while ``create_engine_config`` builds the config; on the
finished config the plugin checks what the validator would, then turns EPLB on
with gloo weight exchange via host staging and synchronous rearrangement (the
async mode needs a second stream, which neither the bridge nor emulation has).
Upstream change that removes it: the validator asking the platform."""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

# Imported while vLLM imports (patches/engine_args.py): vLLM only inside calls.
# vLLM's weight exchange where the device has no NIXL or XCCL (config/parallel.py).
COMMUNICATOR = "torch_gloo"


def with_eplb(create: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``EngineArgs.create_engine_config`` (see the module doc)."""

    @functools.wraps(create)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        from vllm.config import EPLBConfig

        from vllm_hpu import device

        # The condition register() returns the platform on.
        active = device.hpu_available() or device.is_emulation()
        if not (self.enable_eplb and active):
            return create(self, *args, **kwargs)
        if self.enable_elastic_ep:  # vLLM would name EPLB, not elastic EP
            raise ValueError(
                "The HPU plugin does not support elastic expert parallelism "
                "(--enable-elastic-ep) yet: vLLM scales it over NCCL stateless "
                "groups; start vLLM without it."
            )
        asked = self.eplb_config
        self.enable_eplb, self.eplb_config = False, EPLBConfig()
        try:
            config = create(self, *args, **kwargs)
        finally:
            self.enable_eplb, self.eplb_config = True, asked
        enable_on(config.parallel_config, asked)
        return config

    return wrapped


def enable_on(parallel: Any, asked: Any) -> None:
    """EPLB on a config built without it, checked as vLLM checks it."""
    if not parallel.enable_expert_parallel:
        raise ValueError("enable_expert_parallel must be True to use EPLB.")
    ranks = (
        parallel.tensor_parallel_size
        * parallel.prefill_context_parallel_size
        * parallel.data_parallel_size
    )
    if ranks <= 1:
        raise ValueError(
            "EPLB requires tensor, prefill-context, or data parallelism; the HPU "
            "plugin got one rank."
        )
    if asked.use_async:
        from vllm.logger import init_logger

        init_logger("vllm.hpu.eplb").info(
            "EPLB rearranges experts synchronously between steps on HPU: vLLM's "
            "asynchronous mode needs a second accelerator stream the plugin "
            "does not drive."
        )
    parallel.eplb_config = dataclasses.replace(
        asked, use_async=False, communicator=asked.communicator or COMMUNICATOR
    )
    parallel.enable_eplb = True
