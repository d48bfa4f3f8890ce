"""torch.compile with the bridge's hpu_backend in eager mode: a compiled graph
is one compilation and runs on the device; sizes that dynamo cannot give a value
(mark_unbacked) fail as Habana's recipe compiler fails on them (vllm-gaudi
vllm_gaudi/patches.py:21-27), while dynamic=True sizes compile (vllm-gaudi
compiles with them itself, ops/hpu_grouped_topk_router.py:13-17)."""

import pytest
import torch


def _compilations() -> int:
    from habana_frameworks.torch.hpu.metrics import metric_global

    return dict(metric_global("graph_compilation").stats())["TotalNumber"]


def test_a_compiled_function_is_one_compilation(bridge):
    compiled = torch.compile(
        lambda x: torch.relu(x * 2 - 1).sum(-1), backend="hpu_backend"
    )
    x = torch.tensor([[0.0, 1.0], [2.0, 3.0]], device="hpu")
    before = _compilations()
    out = compiled(x)
    assert _compilations() == before + 1 and out.device.type == "hpu"
    torch.testing.assert_close(out.cpu(), torch.tensor([1.0, 8.0]))
    compiled(x)
    assert _compilations() == before + 1


def test_dynamic_sizes_compile(bridge):
    compiled = torch.compile(
        lambda x: (x * 2).sum(-1), backend="hpu_backend", dynamic=True
    )
    for rows in (3, 5):
        torch.testing.assert_close(
            compiled(torch.ones(rows, 4, device="hpu")).cpu(), torch.full((rows,), 8.0)
        )


def test_unbacked_sizes_fail_as_the_recipe_compiler_fails(bridge):
    @torch.compile(backend="hpu_backend")
    def count_greater(x, values):
        return (x >= values).sum(-1)

    x = torch.ones(3, 4, device="hpu")
    torch._dynamo.decorators.mark_unbacked(x, 0)
    with pytest.raises(Exception, match="Cannot convert symbols to int"):
        count_greater(x, torch.zeros(3, 1, device="hpu"))
