"""How the model runs: torch.compile, eager, HPU graphs or lazy mode.

On Gaudi ``PT_HPU_LAZY_MODE`` x ``enforce_eager`` picks the mode. In emulation
torch.compile runs only when VLLM_HPU_COMPILE_BACKEND names a backend (a dynamo
trace of SmolLM2 costs about 10 s per bucket on a CPU, an inductor compile 35 to 75 s),
else the model runs eagerly.
"""

import enum
from dataclasses import dataclass
from typing import Any

import torch
from vllm.logger import init_logger

from vllm_hpu import device

logger = init_logger("vllm.hpu.execution")

# Every bucket is one more compiled entry of the model's forward; misses add more.
RECOMPILE_HEADROOM = 64


class ExecutionMode(enum.Enum):
    COMPILE = "torch.compile"
    EAGER = "eager"
    HPU_GRAPHS = "HPU graphs"
    LAZY = "lazy"

    @property
    def compiles_shapes(self) -> bool:
        """Whether a new shape costs a compilation, so warmup pays off: always on
        Gaudi (its eager mode compiles op graphs too), only compiled in emulation."""
        return device.hpu_available() or self is ExecutionMode.COMPILE

    @property
    def captures_graphs(self) -> bool:
        """Whether warmup captures graphs within the graph memory budget. In
        emulation the compiled mode stands in for it with a plain-call wrapper."""
        if self is ExecutionMode.HPU_GRAPHS:
            return True
        return self is ExecutionMode.COMPILE and not device.hpu_available()


def select_mode(
    lazy: bool, enforce_eager: bool, compile_backend: str | None
) -> ExecutionMode:
    """PT_HPU_LAZY_MODE x enforce_eager; no backend (emulation default) is eager."""
    if lazy:
        return ExecutionMode.LAZY if enforce_eager else ExecutionMode.HPU_GRAPHS
    if enforce_eager or compile_backend is None:
        return ExecutionMode.EAGER
    return ExecutionMode.COMPILE


@dataclass(frozen=True)
class CompileOptions:
    backend: str
    fullgraph: bool  # VLLM_T_COMPILE_FULLGRAPH
    max_entries: int  # compiled entries one forward may hold: buckets + headroom


def pack_linear_weights(model: Any, mode: ExecutionMode, keep_layout: bool) -> bool:
    """In eager mode the linear weights are packed for the CPU once (Gaudi:
    nothing to do); whether any was. Compilers lower the layers as vLLM defines
    them (inductor cannot take oneDNN's packed weights as graph inputs), and
    weights that may change or sleep (``keep_layout``) stay as vLLM loaded them."""
    if mode is not ExecutionMode.EAGER or keep_layout:
        return False
    return device.prepare_weights(model)


def compile_model(model: torch.nn.Module, options: CompileOptions) -> None:
    """Compile the whole model in place, one static-shape graph per bucket.

    The whole model rather than each decoder layer: dynamo specialises a layer's
    graph on its attention layer name, so per-layer compiling traced every layer
    once per bucket (60 graphs per bucket pair on SmolLM2, against 1 per bucket).

    Models of one architecture share one code object (their ``forward``) and its
    cache entries, and dynamo counts that code object's compiles for the whole
    process, freed models included: each model adds its own entries to both
    caps, or a process that builds a second engine (RL loops, tests) silently
    runs it eager.
    """
    dynamo_config: Any = torch._dynamo.config
    dynamo_config.recompile_limit += options.max_entries
    dynamo_config.accumulated_recompile_limit += options.max_entries
    device.load_kernels()
    model.compile(backend=options.backend, dynamic=False, fullgraph=options.fullgraph)


def prepare_model(
    model: torch.nn.Module, mode: ExecutionMode, options: CompileOptions | None
) -> Any:
    """Apply the mode to ``model``; returns what runs graph-captured buckets."""
    if mode is ExecutionMode.COMPILE:
        assert options is not None, "torch.compile needs a backend"
        compile_model(model, options)
        logger.info(
            "Execution mode: torch.compile (backend=%s, whole model, static shapes)",
            options.backend,
        )
    else:
        logger.info("Execution mode: %s", mode.value)
    if mode.captures_graphs:
        return device.wrap_in_graph(model)
    return model
