"""Lazy mode (PT_HPU_LAZY_MODE=1, the published bridge's default): operators
gather into a graph until mark_step, which compiles a graph the first time it is
seen; collectives without PT_HPU_ENABLE_LAZY_COLLECTIVES end the graph first and
are refused inside an HPU-graph capture (ProcessGroupHCCL.cpp:461-472);
torch.compile's hpu_backend is for eager mode only."""

import torch
from double_process import run_double

LAZY = """
import torch, habana_frameworks.torch as ht
import habana_frameworks.torch.core as htcore
from habana_frameworks.torch.hpu.metrics import metric_global
from habana_frameworks.torch._double import native

def compiled():
    return dict(metric_global("graph_compilation").stats())["TotalNumber"]

print("graphs in torch.hpu", hasattr(torch.hpu, "wrap_in_hpu_graph"))
x = torch.ones(4, device="hpu")
htcore.mark_step()
start = compiled()
for _ in range(3):
    y = (x * 2 + 1).sum()
    print("pending", native.graph_stats()["pending_ops"] > 0)
    htcore.mark_step()
print("same graph compiled once", compiled() - start == 1)
five = torch.ones(5, device="hpu")
htcore.mark_step()
z = (five * 2 + 1).sum()
htcore.mark_step()
print("new shapes compile again", compiled() - start == 3)
(x * 3).sum().item()  # a host read runs the pending graph
print("host read ran it", native.graph_stats()["pending_ops"] == 0)
try:
    torch.compile(lambda t: t * 2, backend="hpu_backend")(x)
except Exception as error:
    print("compile refused", "lazy mode" in str(error))
"""


def test_lazy_mode_gathers_operators_until_mark_step():
    out = run_double(LAZY, PT_HPU_LAZY_MODE="1")
    for line in (
        "graphs in torch.hpu True",
        "same graph compiled once True",
        "new shapes compile again True",
        "host read ran it True",
        "compile refused True",
    ):
        assert line in out
    assert out.count("pending True") == 3


COLLECTIVE_IN_GRAPH = """
import torch, torch.distributed as dist, habana_frameworks.torch
from habana_frameworks.torch.hpu.graphs import wrap_in_hpu_graph
dist.init_process_group("hccl", store=dist.HashStore(), rank=0, world_size=1)

class Reduce(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        dist.all_reduce(y)
        return y + 1

module = wrap_in_hpu_graph(Reduce())
try:
    module(torch.ones(2, device="hpu"))
    module(torch.full((2,), 3.0, device="hpu"))
    print("replayed", module(torch.full((2,), 3.0, device="hpu")).cpu().tolist())
except RuntimeError as error:
    print("refused", "collective nonSFG is not supported" in str(error))
"""


def test_collectives_in_a_captured_graph_need_lazy_collectives():
    refused = run_double(COLLECTIVE_IN_GRAPH, PT_HPU_LAZY_MODE="1")
    assert "refused True" in refused
    allowed = run_double(
        COLLECTIVE_IN_GRAPH,
        PT_HPU_LAZY_MODE="1",
        PT_HPU_ENABLE_LAZY_COLLECTIVES="true",
    )
    assert "replayed [7.0, 7.0]" in allowed


def test_mark_step_does_nothing_in_eager_mode(bridge):
    import habana_frameworks.torch.core as htcore
    from habana_frameworks.torch._double import native

    x = torch.ones(3, device="hpu") * 2
    htcore.mark_step("any", "arguments", at="all")
    assert native.graph_stats()["pending_ops"] == 0
    assert x.device.type == "hpu"
