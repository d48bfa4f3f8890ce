"""What one system's run reports, shared by every child process and the report.

Stdlib only: the vLLM native CPU peer runs its child in another virtualenv.
"""

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

# SystemResult.profile's key for the whole run, beside its attention regions.
PROFILE_ALL = "all"


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between ranks."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_summary(values: list[float]) -> dict[str, float] | None:
    """Median and p99 in seconds, or None when nothing was measured."""
    if not values:
        return None
    return {"median": percentile(values, 50), "p99": percentile(values, 99)}


def token_latencies(
    start: float, token_times: list[list[float]]
) -> tuple[list[float], list[float]]:
    """(time to first token of each request, every gap between its tokens),
    from the wall-clock time each request's tokens reached the caller."""
    ttft = [times[0] - start for times in token_times if times]
    itl = [b - a for times in token_times for a, b in itertools.pairwise(times)]
    return ttft, itl


@dataclasses.dataclass
class SystemResult:
    system: str
    status: str = "ok"  # ok | skipped | failed
    note: str = ""
    threads: int = 0
    startup_s: float | None = None  # engine or model construction, warmup included
    warmup_s: float | None = None  # the worker's compile_or_warm_up_model
    elapsed_s: float | None = None  # the timed workload, first add to last token
    num_requests: int = 0
    output_tokens: int = 0  # each request's own output length, summed
    computed_tokens: int = 0  # tokens the system generated, padding rows included
    ttft_s: dict[str, float] | None = None
    itl_s: dict[str, float] | None = None
    buckets: dict[str, int] | None = None  # plugin: prompt / decode bucket counts
    padding: dict[str, float] | None = None  # plugin: padding ratios per kind
    compiled_graphs: int | None = None  # plugin: torch.compile graphs built
    overhead: list[dict[str, Any]] | None = None  # plugin: per decode batch size
    # plugin, profiled: {PROFILE_ALL or an attention region: {operator: seconds}}
    profile: dict[str, dict[str, float]] | None = None

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dataclasses.asdict(self), indent=1))

    @classmethod
    def load(cls, path: Path) -> "SystemResult":
        return cls(**json.loads(path.read_text()))
