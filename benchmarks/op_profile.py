"""Where the plugin's time goes on the benchmark workload, operator by operator.

The workload runs once more in a fresh plugin process under torch.profiler. Each
operator's own time is summed over the run, in all and inside the attention ops
(``probes.ATTENTION_REGIONS``), so that a change can be aimed at what costs and
checked against it. Run by ``benchmarks.run --profile`` (docs/benchmarks.md).
"""

import collections
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from benchmarks import probes
from benchmarks.results_schema import PROFILE_ALL, SystemResult
from benchmarks.vllm_system import (
    WARMUP_REQUEST,
    build_llm,
    record_run,
    run_requests,
)
from benchmarks.workload import child_parser, load_workload

# A region marker's own time: Python and dispatch between the region's operators.
BETWEEN_OPERATORS = "(Python between operators)"


def _region(event: Any) -> str | None:
    """The attention region an event ran in (itself, if it is a marker), or None."""
    while event is not None and event.name not in probes.ATTENTION_REGIONS:
        event = event.cpu_parent
    return None if event is None else event.name


def seconds_by_operator(events: Iterable[Any]) -> dict[str, dict[str, float]]:
    """{PROFILE_ALL or a region: {operator: seconds of its own time}} over torch
    profiler events (each with ``name``, ``self_cpu_time_total`` in microseconds
    and ``cpu_parent``)."""
    split: dict[str, collections.Counter[str]] = collections.defaultdict(
        collections.Counter
    )
    for event in events:
        is_marker = event.name in probes.ATTENTION_REGIONS
        name = BETWEEN_OPERATORS if is_marker else event.name
        seconds = event.self_cpu_time_total / 1e6
        split[PROFILE_ALL][name] += seconds
        region = _region(event)
        if region is not None:
            split[region][name] += seconds
    return {key: dict(counter) for key, counter in split.items()}


def main() -> None:
    parser = child_parser(__doc__)
    parser.add_argument("--llm-kwargs", default="{}")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    requests = load_workload(Path(args.workload))
    probes.mark_attention_regions()
    # Synchronous steps: the profile splits one thread's operators by region.
    llm = build_llm(args, {"async_scheduling": False})
    run_requests(llm, [WARMUP_REQUEST])
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU]
    ) as prof:
        start, token_times = run_requests(llm, requests)
    result = SystemResult(system=args.system, threads=torch.get_num_threads())
    record_run(result, len(requests), start, token_times)
    result.profile = seconds_by_operator(prof.events())
    result.save(Path(args.out))


if __name__ == "__main__":
    main()
