"""graph_compilation and cpu_fallback, counted by the emulated device.

graph_compilation: eager mode compiles one recipe per new (operator, shapes);
lazy mode one per new graph (the operators between two steps); an HPU-graph
capture and a torch.compile graph count one each. cpu_fallback: the device runs
every operator itself, so no operator falls back to the host.
"""

import contextlib
from collections.abc import Iterator
from typing import Any

from habana_frameworks.torch._double import native


class Metric:
    def name(self) -> str:
        raise NotImplementedError

    def stats(self) -> list[tuple[str, Any]]:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError


class GraphCompilationMetric(Metric):
    def __init__(self) -> None:
        self._base = 0

    def name(self) -> str:
        return "graph_compilation"

    def stats(self) -> list[tuple[str, Any]]:
        total = native.graph_stats()["compilations"] - self._base
        return [("TotalNumber", total), ("TotalTime", 0), ("AvgTime", 0)]

    def reset(self) -> None:
        self._base = native.graph_stats()["compilations"]


class CpuFallbackMetric(Metric):
    def name(self) -> str:
        return "cpu_fallback"

    def stats(self) -> list[tuple[str, Any]]:
        return [("TotalNumber", 0), ("FallbackOps", {})]

    def reset(self) -> None:
        return None


_GLOBAL: dict[str, Metric] = {
    "graph_compilation": GraphCompilationMetric(),
    "cpu_fallback": CpuFallbackMetric(),
}


def metric_global(name: str) -> Metric:
    """The process-wide metric ``name`` (metrics.py:406-408)."""
    return _GLOBAL[name]


@contextlib.contextmanager
def metric_localcontext(name: str) -> Iterator[Metric]:
    metric = {
        "graph_compilation": GraphCompilationMetric,
        "cpu_fallback": CpuFallbackMetric,
    }[name]()
    metric.reset()
    yield metric
