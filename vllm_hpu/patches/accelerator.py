"""torch.accelerator calls where torch has no accelerator (CPU emulation)."""

import functools

import torch

# torch.accelerator calls in CPU emulation.
# Why: vLLM's model loader and shutdown call ``torch.accelerator.empty_cache``,
# ``synchronize`` and ``empty_host_cache`` unconditionally; on a CPU-only torch they
# raise "Cannot access accelerator device when none is available". vLLM skips them
# only for its own CPU platform (``vllm/v1/worker/cpu_model_runner.py``).
# How: in CPU emulation, and only when torch reports no accelerator, those three
# functions become no-ops, which is what they mean on a machine without one.
# Upstream change that removes it: vLLM guarding those calls with
# ``torch.accelerator.is_available()``.


def _noop(*args: object, **kwargs: object) -> None:
    return None


@functools.cache
def apply_emulation_patches() -> None:
    """Idempotent; call only in CPU emulation."""
    if torch.accelerator.is_available():
        return
    for name in ("empty_cache", "synchronize", "empty_host_cache"):
        if hasattr(torch.accelerator, name):
            setattr(torch.accelerator, name, _noop)
