"""``hpu_backend``, the bridge's torch.compile backend (bridge v1.19.0
dynamo/compile_backend/backends.py:47-72): AOT autograd over the HPU graph
compiler. Here the graph dynamo captured runs as it is on the emulated device,
counted as one compiled graph: the same results, without AOT autograd's
functionalization, which would copy every mutated input (a whole KV cache per
layer and step) where the graph compiler writes in place.

Two documented limits are enforced:
- lazy mode: torch.compile with hpu_backend is not supported there (Intel
  Gaudi PyTorch Support Matrix); the double refuses it rather than guess;
- unbacked sizes: Habana's recipe compiler raises "TypeError: Cannot convert
  symbols to int" where a size has no value to fall back on, as the sizes
  ``mark_unbacked`` makes (vllm-gaudi 091bbad vllm_gaudi/patches.py:21-27,
  286-292); sizes ``dynamic=True`` makes symbolic keep a value, and vllm-gaudi
  itself compiles with them (ops/hpu_grouped_topk_router.py:13-17).
"""

from collections.abc import Callable
from typing import Any

import torch
from torch._dynamo.backends.registry import register_backend
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from habana_frameworks.torch._double import native
from habana_frameworks.torch.utils.internal import is_lazy


def _has_unbacked_sizes(gm: torch.fx.GraphModule) -> bool:
    """Whether a graph input has a size dynamo traced as unbacked."""
    for node in gm.graph.find_nodes(op="placeholder"):
        value = node.meta.get("example_value")
        if node.meta.get("unbacked_bindings") or free_unbacked_symbols(value):
            return True
    return False


def _recipe_compiler(
    gm: torch.fx.GraphModule, example_inputs: list[Any]
) -> Callable[..., Any]:
    if _has_unbacked_sizes(gm):
        raise TypeError("Cannot convert symbols to int")
    native.count_compilation()

    def run(*args: Any) -> Any:
        native.pause_counting(True)
        try:
            return gm(*args)
        finally:
            native.pause_counting(False)

    return run


@register_backend
def hpu_backend(
    graph_module: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any
) -> Any:
    if is_lazy():
        raise RuntimeError(
            "hpu_backend: torch.compile is not supported in lazy mode "
            "(PT_HPU_LAZY_MODE=1); use PT_HPU_LAZY_MODE=0"
        )
    return _recipe_compiler(graph_module, example_inputs)
