"""Where Habana's torch build differs from stock torch in ways vLLM meets.

The double stands for Habana's torch as well as its bridge; on stock torch it
applies these differences when the bridge is imported:

- ``torch.accelerator``'s memory calls (``empty_cache``, ``memory_stats``, ...)
  fail with "Allocator for hpu is not a DeviceAllocator": HPU's allocator is a
  plain ``c10::Allocator`` (vllm-gaudi 091bbad vllm_gaudi/patches.py:5-10). The
  emulated device registers such an allocator (csrc/hpu_device.cpp), so torch
  itself raises that error; nothing to apply here.
- ``torch._C._host_emptyCache`` does not exist on HPU (patches.py:12-13).
- ``torch._dynamo.decorators.mark_unbacked`` is a forbidden callable under
  dynamo on HPU (patches.py:33-40: "Attempt to trace forbidden callable
  mark_unbacked").
"""

import torch


def apply() -> None:
    if hasattr(torch._C, "_host_emptyCache"):
        delattr(torch._C, "_host_emptyCache")
    torch._dynamo.decorators.mark_unbacked._dynamo_forbidden = True  # type: ignore[attr-defined]
