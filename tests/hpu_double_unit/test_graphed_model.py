"""The runner's GraphedModel (worker/compilation/execution.py) on the double's
HPU graphs, which record device operators and replay them on the recorded
tensors: a replay of a captured bucket gives the later pass's output, since
the attention metadata are graph inputs; the model wrapped and its metadata set
in vLLM's forward context outside (the runner's former convention, review D5)
replays the recorded pass's slots; an uncaptured bucket runs eagerly."""

import pytest
import torch

LAYER = "model.layers.0.self_attn.attn"
PASSES = {"first": ([[0, 1], [2, 3]], 1), "later": ([[4, 5], [6, 7]], 2)}


class ReadsMetadata(torch.nn.Module):
    def forward(self, input_ids, positions, intermediate_tensors=None):
        from vllm.forward_context import get_forward_context

        metadata = get_forward_context().attn_metadata[LAYER]
        blocks = metadata.decode_blocks().block_list
        return input_ids + 100 * metadata.slot_mapping + 10_000 * blocks[0]


def _pass(name):
    """A fresh decode pass on the HPU (a replay writes into the recorded one's)."""
    from vllm_hpu.attention.metadata import (
        CacheGeometry,
        SeqLayout,
        build_decode_metadata,
    )
    from vllm_hpu.bucketing import Bucket
    from vllm_hpu.worker.passes.forward_pass import ForwardPass

    tables, token = PASSES[name]
    hpu = torch.device("hpu")
    cache = CacheGeometry(4, 20, torch.float32, hpu)
    metadata = build_decode_metadata([SeqLayout(t, 5, 1) for t in tables], 2, 8, cache)
    ids, positions = (
        torch.full((2,), token, device=hpu),
        torch.full((2,), 5, device=hpu),
    )
    return ForwardPass(False, Bucket(2, 1, 8), [], ids, positions, (metadata,), [])


def _eager(name):
    from vllm.config import VllmConfig
    from vllm.forward_context import set_forward_context

    forward_pass = _pass(name)
    with set_forward_context({LAYER: forward_pass.attn_metadata}, VllmConfig()):
        return ReadsMetadata()(forward_pass.input_ids, forward_pass.positions).cpu()


def _graphed(captured):
    from vllm.config import VllmConfig

    from vllm_hpu.worker.compilation.execution import (
        ExecutionMode,
        GraphedModel,
        graph_key,
    )

    keys = {graph_key(_pass("first"))} if captured else set()
    graphed = GraphedModel(ReadsMetadata(), VllmConfig(), keys)
    graphed.prepare(ExecutionMode.HPU_GRAPHS, None)
    return graphed


def _run(graphed, name):
    forward_pass = _pass(name)
    inputs = {"input_ids": forward_pass.input_ids, "positions": forward_pass.positions}
    return graphed.run(forward_pass, inputs, {LAYER: forward_pass.attn_metadata}).cpu()


@pytest.mark.parametrize("captured", [True, False], ids=["captured", "eager"])
@torch.inference_mode()
def test_graphed_model_replays_each_pass_metadata(bridge, captured):
    graphed = _graphed(captured)
    for name in ("first", "later", "first"):
        torch.testing.assert_close(_run(graphed, name), _eager(name))


@torch.inference_mode()
def test_metadata_outside_the_wrapped_forward_replays_stale(bridge):
    from vllm.config import VllmConfig
    from vllm.forward_context import set_forward_context

    from vllm_hpu import device

    call = device.wrap_in_graph(ReadsMetadata())
    outputs = []
    for forward_pass in map(_pass, ("first", "later")):
        with set_forward_context({LAYER: forward_pass.attn_metadata}, VllmConfig()):
            ids, positions = forward_pass.input_ids, forward_pass.positions
            outputs.append(call(True, input_ids=ids, positions=positions).cpu())
    torch.testing.assert_close(outputs[1], _eager("first") + 1)  # ids 1 -> 2
    assert not torch.equal(outputs[1], _eager("later"))
