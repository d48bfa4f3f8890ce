"""HPU graphs replay what the recorded forward takes as arguments, nothing else.

The bridge's ``wrap_in_hpu_graph`` records a graph per structure of the wrapped
forward's (args, kwargs), and a replay copies only the tensors among them into
the recorded ones; every other tensor the forward read (vLLM's forward context,
so the attention and state metadata the runner used to set outside it) is the
one read at recording. ``FakeHpuGraphs`` plays the bridge's part on the CPU, so
these tests check ``device.wrap_in_graph`` and the runner's ``GraphedModel``
(worker/compilation/execution.py) against it: a replay gives a later pass's
tokens, not the recorded pass's.
"""

from collections.abc import Callable
from typing import Any

import pytest
import torch
import vllm.forward_context as forward_context
from vllm.config import VllmConfig
from vllm.forward_context import (
    get_forward_context,
    override_forward_context,
    set_forward_context,
)

from vllm_hpu import device
from vllm_hpu.attention.metadata import CacheGeometry, SeqLayout, build_decode_metadata
from vllm_hpu.bucketing import Bucket
from vllm_hpu.worker.compilation.execution import (
    ExecutionMode,
    GraphedModel,
    graph_key,
)
from vllm_hpu.worker.passes.forward_pass import ForwardPass

LAYER = "model.layers.0.self_attn.attn"
CACHE = CacheGeometry(4, 20, torch.float32, torch.device("cpu"))
BUCKET = Bucket(2, 1, 8)


def _structure(value: Any) -> Any:
    """What the bridge keys a graph by (``input_hash``): tensor shapes, every
    other leaf's own hash; dicts, lists and tuples walked."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype)
    if isinstance(value, dict):
        return tuple((key, _structure(item)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(_structure(item) for item in value)
    hash(value)  # the bridge hashes every other leaf: a dataclass fails here
    return value


def _copy_into(recorded: Any, given: Any) -> None:
    if isinstance(recorded, torch.Tensor):
        recorded.copy_(given)
    elif isinstance(recorded, dict):
        for key, item in recorded.items():
            _copy_into(item, given[key])
    elif isinstance(recorded, (list, tuple)):
        for mine, theirs in zip(recorded, given, strict=True):
            _copy_into(mine, theirs)


class FakeHpuGraphs:
    """The bridge's graph module as the runner uses it: ``wrap_in_hpu_graph``
    replaces the forward in place; a call records on its structure's first use
    (its inputs become the graph's), replays after by copying the new inputs'
    tensors into the recorded ones and running on those, under the forward
    context of the recording (nothing outside the arguments is read afresh);
    ``bypass_hpu_graphs=True`` runs the forward as it is. (tests/hpu_double
    records the operators themselves: tests/hpu_double_unit/test_graphed_model.py.)"""

    def __init__(self) -> None:
        self.recorded = 0

    def wrap_in_hpu_graph(
        self, module: torch.nn.Module, disable_tensor_cache: bool = False
    ) -> torch.nn.Module:
        forward = module.forward
        graphs: dict[Any, tuple[Any, Any]] = {}

        def wrapped(*args: Any, bypass_hpu_graphs: bool = False, **kwargs: Any) -> Any:
            if bypass_hpu_graphs:
                return forward(*args, **kwargs)
            key = _structure((args, kwargs))
            if key not in graphs:
                self.recorded += 1
                graphs[key] = ((args, kwargs), forward_context._forward_context)
            (recorded_args, recorded_kwargs), context = graphs[key]
            _copy_into((recorded_args, recorded_kwargs), (args, kwargs))
            with override_forward_context(context):
                return forward(*recorded_args, **recorded_kwargs)

        module.forward = wrapped  # type: ignore[method-assign]
        module.clear_cache = graphs.clear  # type: ignore[assignment]
        return module


class ReadsMetadata(torch.nn.Module):
    """A model whose output depends on what an attention layer reads from
    vLLM's forward context: its slot mapping and its decode blocks."""

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate_tensors: Any = None,
    ) -> torch.Tensor:
        metadata = get_forward_context().attn_metadata[LAYER]
        blocks = metadata.decode_blocks().block_list
        return input_ids + 100 * metadata.slot_mapping + 10_000 * blocks[0]


@pytest.fixture
def bridge(monkeypatch: pytest.MonkeyPatch) -> FakeHpuGraphs:
    fake = FakeHpuGraphs()
    monkeypatch.setattr(device, "_hpu_graphs", lambda: fake)
    return fake


PASSES = {"first": ([[0, 1], [2, 3]], 1), "later": ([[4, 5], [6, 7]], 2)}


def _pass(name: str) -> ForwardPass:
    """A decode pass of two rows in ``BUCKET``, each row's token at position 5:
    its tensors made afresh, as the runner makes every pass's (a replay writes
    into the recorded pass's)."""
    block_tables, token = PASSES[name]
    seqs = [SeqLayout(table, 5, 1) for table in block_tables]
    metadata = build_decode_metadata(seqs, BUCKET.batch_size, BUCKET.num_blocks, CACHE)
    return ForwardPass(
        is_prompt=False,
        bucket=BUCKET,
        seqs=[],
        input_ids=torch.full((2,), token),
        positions=torch.full((2,), 5),
        group_metadata=(metadata,),
        first_token_indices=[],
    )


def _eager(name: str) -> torch.Tensor:
    forward_pass = _pass(name)
    metadata = {LAYER: forward_pass.attn_metadata}
    with set_forward_context(metadata, VllmConfig()):
        return ReadsMetadata()(forward_pass.input_ids, forward_pass.positions)


def _run(graphed: GraphedModel, name: str) -> torch.Tensor:
    forward_pass = _pass(name)
    inputs = {"input_ids": forward_pass.input_ids, "positions": forward_pass.positions}
    return graphed.run(forward_pass, inputs, {LAYER: forward_pass.attn_metadata})


def _graphed(graphed_buckets: set[Any]) -> GraphedModel:
    graphed = GraphedModel(ReadsMetadata(), VllmConfig(), graphed_buckets)
    graphed.prepare(ExecutionMode.HPU_GRAPHS, None)
    return graphed


def test_replayed_graph_reads_the_later_pass_metadata(bridge: FakeHpuGraphs) -> None:
    graphed = _graphed({graph_key(_pass("first"))})
    names = ("first", "later", "first")
    outputs = [_run(graphed, name).clone() for name in names]
    assert bridge.recorded == 1  # the later passes replayed the first one's graph
    for output, name in zip(outputs, names, strict=True):
        torch.testing.assert_close(output, _eager(name))


def test_metadata_set_outside_the_graph_replays_stale(bridge: FakeHpuGraphs) -> None:
    """The runner's former calling convention, as a control of the fake: the
    model wrapped and called with its token inputs alone, the metadata set in
    vLLM's forward context around the call; its replay reads the first
    pass's slots and blocks."""
    call: Callable[..., Any] = device.wrap_in_graph(ReadsMetadata())
    outputs = []
    for forward_pass in map(_pass, ("first", "later")):
        metadata = {LAYER: forward_pass.attn_metadata}
        with set_forward_context(metadata, VllmConfig()):
            ids, positions = forward_pass.input_ids, forward_pass.positions
            outputs.append(call(True, input_ids=ids, positions=positions).clone())
    assert bridge.recorded == 1
    new_ids = _pass("later").input_ids - _pass("first").input_ids
    torch.testing.assert_close(outputs[1], _eager("first") + new_ids)
    assert not torch.equal(outputs[1], _eager("later"))


def test_passes_of_uncaptured_buckets_run_eagerly(bridge: FakeHpuGraphs) -> None:
    """A bucket warmup did not capture records nothing (the bridge would have
    recorded every bucket on first sight, past the graph memory budget)."""
    graphed = _graphed(set())
    for name in ("first", "later"):
        torch.testing.assert_close(_run(graphed, name), _eager(name))
    assert bridge.recorded == 0


def test_reset_records_again(bridge: FakeHpuGraphs) -> None:
    graphed = _graphed({graph_key(_pass("first"))})
    _run(graphed, "first")
    graphed.reset()
    torch.testing.assert_close(_run(graphed, "later"), _eager("later"))
    assert bridge.recorded == 2


@pytest.mark.skipif(device.hpu_available(), reason="emulation's behaviour")
def test_emulation_records_nothing() -> None:
    """Without Gaudi the wrapped forward runs as it is, graphed or not."""
    graphed = _graphed({graph_key(_pass("first"))})
    for name in ("first", "later"):
        torch.testing.assert_close(_run(graphed, name), _eager(name))
