"""vLLM's MoE config accepting non-gated experts (Nemotron-H's relu2) here."""

import functools
from typing import Any

_NON_GATED_REFUSAL = "is_act_and_mul=False"


# Non-gated experts on the platform.
# Why: ``FusedMoEConfig.__post_init__`` ends by raising NotImplementedError for
# experts without a gate (``is_act_and_mul`` False: Nemotron-H's relu2) on every
# platform but CUDA, ROCm and XPU, whose kernels run them; the plugin's MoE
# method runs them in plain torch (ops/moe.py) and refuses what it cannot run
# (ops/fused_moe.check_supported).
# How: that check is the method's last statement: the wrapper lets that one
# error pass for a non-gated config and raises any other.
# Upstream change that removes it: the check asking the platform (or the MoE
# method it builds) whether it runs non-gated experts.
@functools.cache
def accept_non_gated_experts() -> None:
    from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig

    post_init = FusedMoEConfig.__post_init__

    def checked_post_init(self: Any) -> None:
        try:
            post_init(self)
        except NotImplementedError as error:
            if self.is_act_and_mul or _NON_GATED_REFUSAL not in str(error):
                raise

    FusedMoEConfig.__post_init__ = checked_post_init  # type: ignore[method-assign]
