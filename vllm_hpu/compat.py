"""Where vLLM 0.32 and 0.33 differ: the only module that asks which vLLM runs
(README_GAUDI.md, "vLLM versions"). Each function names what changed; when
0.32 is dropped, each keeps its 0.33 side."""

import importlib.metadata
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from packaging.version import Version

if TYPE_CHECKING:
    import torch
    from vllm.distributed.weight_transfer.base import WeightSource

# The releases the plugin runs on, oldest first (their patch releases too).
SUPPORTED = ("0.32", "0.33")
# From the distribution: vLLM may still be importing itself at the entry point.
VLLM_VERSION = Version(importlib.metadata.version("vllm"))
VLLM_0_33 = VLLM_VERSION.release[:2] >= (0, 33)


def unsupported_vllm_version() -> str | None:
    """Why the installed vLLM is one the plugin was not written for, or None."""
    release = ".".join(str(part) for part in VLLM_VERSION.release[:2])
    if release in SUPPORTED:
        return None
    return (
        f"vLLM {VLLM_VERSION}: the HPU plugin runs on vLLM "
        f"{' and '.join(SUPPORTED)}; install one of them "
        f"(pip install --no-deps vllm=={SUPPORTED[-1]}.0, as README.md's set-up does)"
    )


def legacy_ray_executor_requested() -> bool:
    """vLLM 0.32's older Ray executor (VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0)."""
    if VLLM_0_33:
        return False
    from vllm import envs

    return not envs.VLLM_USE_RAY_V2_EXECUTOR_BACKEND


def register_fp8_block_kernel(kernel: type) -> None:
    """Make ``kernel`` the block-fp8 linear kernel (idempotent): 0.33 registers kind
    ``"fp8_block"``; 0.32 gets it into ``_POSSIBLE_FP8_BLOCK_KERNELS``."""
    from vllm.model_executor.kernels import linear
    from vllm.platforms import PlatformEnum

    if kernel in linear._POSSIBLE_FP8_BLOCK_KERNELS.get(PlatformEnum.OOT, []):
        return
    if VLLM_0_33:
        linear.register_linear_kernel(kernel, PlatformEnum.OOT, "fp8_block")
    else:
        linear._POSSIBLE_FP8_BLOCK_KERNELS.setdefault(PlatformEnum.OOT, []).append(
            kernel
        )


def weight_source_tensors(
    source: "WeightSource",
) -> Iterator[tuple[str, "torch.Tensor"]]:
    """A trainer's weights as whole ``(name, tensor)`` pairs: 0.32's ``WeightSource``
    iterates them, 0.33's yields them from ``iter_full()``."""
    if VLLM_0_33:
        return source.iter_full()  # type: ignore[attr-defined]
    return iter(source)  # type: ignore[call-overload]


def trainer_engine_kwargs(rank: int) -> dict[str, Any]:
    """What ``TrainerWeightTransferEngine.__init__`` takes beyond 0.32's: vLLM
    0.33 records the trainer rank (sources yield the parameters it owns)."""
    return {"rank": rank} if VLLM_0_33 else {}


def unrun_speculative_options(spec: Any) -> dict[str, bool]:
    """Options of vLLM 0.33's speculative config the HPU proposers do not
    implement, by name -> set (none on 0.32, which lacks them)."""
    if not VLLM_0_33:
        return {}
    quantized_head = spec.draft_lm_head_quantization
    return {
        f"draft_lm_head_quantization '{quantized_head}' (Model Runner V2 only)": (
            quantized_head is not None
        ),
    }
