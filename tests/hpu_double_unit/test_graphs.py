"""HPU graphs as the bridge captures them (hpu/graphs.py:488-753): the wrapped
module is the same object, a replay reads new data only through the graph's
inputs, and capture is keyed by the inputs' hash."""

import torch


class _Scaled(torch.nn.Module):
    """y = x @ w + bias, where ``bias`` is no graph input: the shape of
    attention metadata reaching a model through a context, not its arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(
            torch.eye(3, device="hpu"), requires_grad=False
        )
        self.bias = torch.zeros(3, device="hpu")
        self.calls = 0

    def forward(self, x: torch.Tensor, meta: object = None) -> torch.Tensor:
        self.calls += 1
        return x @ self.weight + self.bias


def _wrapped() -> _Scaled:
    from habana_frameworks.torch.hpu.graphs import wrap_in_hpu_graph

    module = _Scaled()
    assert wrap_in_hpu_graph(module, disable_tensor_cache=True) is module
    return module


@torch.inference_mode()
def test_a_replay_reads_inputs_and_in_place_updates_but_not_new_tensors(bridge):
    module = _wrapped()
    x = torch.ones(2, 3, device="hpu")
    torch.testing.assert_close(module(x).cpu(), torch.ones(2, 3))
    assert module.calls == 1  # captured
    module.bias.fill_(1.0)  # in place: the captured tensor itself
    torch.testing.assert_close(module(x).cpu(), torch.full((2, 3), 2.0))
    module.bias = torch.full((3,), 10.0, device="hpu")  # a new tensor: unseen
    new_input = torch.full((2, 3), 3.0, device="hpu")
    torch.testing.assert_close(module(new_input).cpu(), torch.full((2, 3), 4.0))
    assert module.calls == 1  # replays run no Python
    bypassed = module(new_input, bypass_hpu_graphs=True)
    torch.testing.assert_close(bypassed.cpu(), torch.full((2, 3), 13.0))


@torch.inference_mode()
def test_replays_return_the_capture_time_outputs(bridge):
    module = _wrapped()
    first = module(torch.ones(1, 3, device="hpu"))
    second = module(torch.full((1, 3), 2.0, device="hpu"))
    assert second is first
    torch.testing.assert_close(first.cpu(), torch.full((1, 3), 2.0))


@torch.inference_mode()
def test_capture_is_keyed_by_shapes_and_by_the_identity_of_plain_objects(bridge):
    module = _wrapped()
    module(torch.ones(1, 3, device="hpu"))
    module(torch.ones(2, 3, device="hpu"))
    assert module.calls == 2  # a new shape is a new graph
    meta = object()
    module(torch.ones(2, 3, device="hpu"), meta)
    module(torch.ones(2, 3, device="hpu"), meta)
    module(torch.ones(2, 3, device="hpu"), object())
    assert module.calls == 4  # a new object hashes anew: one more capture
    module.clear_cache()
    module(torch.ones(1, 3, device="hpu"))
    assert module.calls == 5


@torch.inference_mode()
def test_wrapping_replaces_forward_so_every_call_is_captured(bridge):
    """The review's D5(b): the module is the graph; only bypass_hpu_graphs
    runs eagerly, and max_graphs caps the captures."""
    from habana_frameworks.torch.hpu.graphs import wrap_in_hpu_graph

    module = _Scaled()
    wrap_in_hpu_graph(module, max_graphs=1)
    module(torch.ones(1, 3, device="hpu"))
    module(torch.ones(1, 3, device="hpu"))
    module(torch.ones(4, 3, device="hpu"))  # cache full: eager
    module(torch.ones(4, 3, device="hpu"))
    assert module.calls == 3


@torch.inference_mode()
def test_a_capture_counts_one_graph_compilation(bridge):
    from habana_frameworks.torch.hpu.metrics import metric_global

    compilations = metric_global("graph_compilation")
    module = _wrapped()
    five, six = torch.ones(5, 3, device="hpu"), torch.ones(6, 3, device="hpu")
    module(five)
    before = dict(compilations.stats())["TotalNumber"]
    for _ in range(3):
        module(five)
    assert dict(compilations.stats())["TotalNumber"] == before
    module(six)
    assert dict(compilations.stats())["TotalNumber"] == before + 1
