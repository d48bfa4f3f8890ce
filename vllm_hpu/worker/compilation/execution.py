"""How the model runs: torch.compile, eager, HPU graphs or lazy mode. On Gaudi
``PT_HPU_LAZY_MODE`` x ``enforce_eager`` picks; in emulation torch.compile runs
only if VLLM_HPU_COMPILE_BACKEND names a backend (a dynamo trace of SmolLM2
costs ~10 s per bucket on a CPU, inductor 35-75 s), else eager."""

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.forward_context import set_forward_context
from vllm.logger import init_logger

from vllm_hpu import device
from vllm_hpu.attention.metadata import HpuAttentionMetadata
from vllm_hpu.bucketing import Bucket
from vllm_hpu.envs import get_envs
from vllm_hpu.worker.compilation.graphs import DECODE, PROMPT
from vllm_hpu.worker.passes.forward_pass import ForwardPass

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
    """Pack linear weights for the CPU once in eager mode (Inductor cannot take packed
    inputs; ``keep_layout`` weights stay as loaded); whether any was."""
    if mode is not ExecutionMode.EAGER or keep_layout:
        return False
    return device.prepare_weights(model)


def compile_model(model: torch.nn.Module, options: CompileOptions) -> None:
    """One static-shape graph per bucket for the whole model, in place (per layer,
    dynamo specialised on layer names: 60 graphs per bucket pair on SmolLM2). Each
    model adds to dynamo's process-wide caps, or a second engine silently runs eager."""
    dynamo_config: Any = torch._dynamo.config
    dynamo_config.recompile_limit += options.max_entries
    dynamo_config.accumulated_recompile_limit += options.max_entries
    device.load_kernels()
    model.compile(backend=options.backend, dynamic=False, fullgraph=options.fullgraph)


def compile_options(num_buckets: int, num_models: int) -> CompileOptions | None:
    """How ``num_models`` models (a same-class draft compiles the code again) compile
    a forward per bucket; None without a backend (emulation's default)."""
    backend = device.model_compile_backend()
    if backend is None:
        return None
    max_entries = num_buckets * num_models + RECOMPILE_HEADROOM
    return CompileOptions(backend, get_envs().compile_fullgraph, max_entries)


GraphKey = tuple[str, Bucket]  # (phase, bucket): a pass's graph


def graph_key(forward_pass: ForwardPass) -> GraphKey:
    return (PROMPT if forward_pass.is_prompt else DECODE, forward_pass.bucket)


class GraphedModel(torch.nn.Module):
    """A model as a step runs it: ``forward`` takes every layer's metadata as
    arguments and sets vLLM's forward context, so a replayed graph reads this
    pass's metadata (the bridge copies only argument tensors). ``run`` replays a
    bucket's graph if in ``graphed`` (shared with a draft), else runs eagerly."""

    def __init__(self, model: Any, vllm_config: VllmConfig, graphed: set[GraphKey]):
        super().__init__()
        self.model = model
        self.vllm_config = vllm_config
        self.graphed = graphed
        self._call: device.GraphCall = lambda use_graph, **inputs: self(**inputs)

    def prepare(self, mode: ExecutionMode, options: CompileOptions | None) -> None:
        if mode is ExecutionMode.COMPILE:
            assert options is not None, "torch.compile needs a backend"
            compile_model(self.model, options)
        if mode.captures_graphs:
            self._call = device.wrap_in_graph(self)

    def run(
        self,
        forward_pass: ForwardPass,
        model_inputs: dict[str, Any],
        metadata: dict[str, Any],
    ) -> Any:
        """Run ``forward_pass``; layers share their group's metadata object."""
        distinct = list({id(m): m for m in metadata.values()}.values())
        index = {id(m): i for i, m in enumerate(distinct)}
        output = self._call(
            graph_key(forward_pass) in self.graphed,
            model_inputs=graph_form(model_inputs),
            metadata=graph_form(tuple(distinct)),
            layer_index={name: index[id(m)] for name, m in metadata.items()},
            num_tokens=forward_pass.num_tokens,
            num_tokens_across_dp=forward_pass.num_tokens_across_dp,
        )
        device.mark_step()
        return output

    def forward(
        self,
        model_inputs: dict[str, Any],
        metadata: tuple[Any, ...],
        layer_index: dict[str, int],
        num_tokens: int,
        num_tokens_across_dp: torch.Tensor | None,
    ) -> Any:
        objects = from_graph_form(metadata)
        by_layer = {name: objects[i] for name, i in layer_index.items()}
        # MLA layers write their cache before attending, from this mapping.
        slot_mapping = {
            name: m.slot_mapping
            for name, m in by_layer.items()
            if isinstance(m, HpuAttentionMetadata)
        }
        with set_forward_context(
            by_layer,
            self.vllm_config,
            num_tokens=num_tokens,
            num_tokens_across_dp=num_tokens_across_dp,
            slot_mapping=slot_mapping,
        ):
            return self.model(**from_graph_form(model_inputs))

    def reset(self) -> None:
        """Forget recorded graphs (their tensors moved: sleep mode)."""
        device.reset_graphs(self)


def graph_form(value: Any) -> Any:
    """``value`` as the bridge takes graph inputs (it hashes/copies nothing else):
    containers of tensors and constants, dataclasses as (class, field values)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return (type(value), *(graph_form(getattr(value, f.name)) for f in fields))
    return _each_item(value, graph_form)


def from_graph_form(value: Any) -> Any:
    """Rebuild what ``graph_form`` took apart around the given tensors (no __init__)."""
    cls = value[0] if isinstance(value, tuple) and value else None
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        rebuilt = object.__new__(cls)
        for field, item in zip(dataclasses.fields(rebuilt), value[1:], strict=True):
            object.__setattr__(rebuilt, field.name, from_graph_form(item))
        return rebuilt
    return _each_item(value, from_graph_form)


def _each_item(value: Any, convert: Callable[[Any], Any]) -> Any:
    if isinstance(value, dict):
        return {key: convert(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(convert(item) for item in value)
    return value
