"""Issue 9's targets, checked against the measured figures of one run."""

from benchmarks.results_schema import SystemResult
from benchmarks.systems import BASELINE, OVERHEAD_SYSTEM, SYSTEMS

PEER = "vLLM CPU backend"
# The plugin as deployed: padded to buckets (exact shapes would compile per shape).
BUCKETED_PLUGIN = {
    s.name for s in SYSTEMS if s.plugin and "VLLM_HPU_EXACT_SHAPES" not in s.env
}
SPEEDUP_TARGET = 9.0  # x the transformers baseline
OVERHEAD_TARGET_MS = 2.0  # runner overhead per decode step at batch 64
PADDING_TARGET = 0.25  # decode padding of the default buckets


def tokens_per_s(result: SystemResult) -> float | None:
    if result.status != "ok" or not result.elapsed_s:
        return None
    return result.output_tokens / result.elapsed_s


def requests_per_s(result: SystemResult) -> float | None:
    if result.status != "ok" or not result.elapsed_s:
        return None
    return result.num_requests / result.elapsed_s


def speedup(result: SystemResult, baseline: SystemResult | None) -> float | None:
    ours = tokens_per_s(result)
    theirs = tokens_per_s(baseline) if baseline is not None else None
    return ours / theirs if ours and theirs else None


def _verdict(met: bool | None) -> str:
    return "n/a" if met is None else ("met" if met else "**missed**")


def _row(target: str, measured: str, met: bool | None) -> str:
    return f"| {target} | {measured} | {_verdict(met)} |"


def _best_plugin(results: list[SystemResult]) -> SystemResult | None:
    ours = [r for r in results if r.system in BUCKETED_PLUGIN and tokens_per_s(r)]
    return max(ours, key=lambda r: tokens_per_s(r) or 0.0, default=None)


def throughput_rows(results: list[SystemResult]) -> list[str]:
    by_name = {r.system: r for r in results}
    best = _best_plugin(results)
    if best is None:
        return [_row("throughput", "no plugin run succeeded", None)]
    ours = tokens_per_s(best) or 0.0
    rows = []
    for name, goal, label in (
        (PEER, 1.0, "throughput >= vLLM CPU backend"),
        (BASELINE, SPEEDUP_TARGET, f"throughput >= {SPEEDUP_TARGET:.0f}x transformers"),
    ):
        ratio = speedup(best, by_name.get(name))
        measured = (
            f"{best.system} {ours:.1f} tok/s = {ratio:.2f}x {name}"
            if ratio is not None
            else f"{name} not measured"
        )
        rows.append(_row(label, measured, None if ratio is None else ratio >= goal))
    return rows


def overhead_rows(overhead: SystemResult | None) -> list[str]:
    figures = (
        {o["batch_size"]: o["input_and_output_ms"] for o in overhead.overhead or []}
        if overhead
        else {}
    )
    if 64 not in figures or 1 not in figures:
        return [_row("runner overhead at batch 64 < 2 ms", "not measured", None)]
    growth = figures[64] / figures[1]
    return [
        _row(
            f"runner overhead per decode step, batch 64 < {OVERHEAD_TARGET_MS:.0f} ms",
            f"{figures[64]:.2f} ms (batch 1: {figures[1]:.2f} ms)",
            figures[64] < OVERHEAD_TARGET_MS,
        ),
        _row(
            "overhead grows sub-linearly with batch",
            f"x{growth:.1f} from batch 1 to 64 (linear: x64)",
            growth < 64,
        ),
    ]


def padding_rows(results: list[SystemResult]) -> list[str]:
    default = next((r for r in results if r.system == OVERHEAD_SYSTEM.name), None)
    if default is None or default.padding is None:
        return [_row("decode padding < 25%", "not measured", None)]
    batch, blocks = default.padding["decode_batch"], default.padding["decode_blocks"]
    return [
        _row(
            f"decode padding of the default buckets < {PADDING_TARGET:.0%}",
            f"batch {batch:.1%}, blocks {blocks:.1%} ({default.system})",
            max(batch, blocks) < PADDING_TARGET,
        )
    ]


def target_rows(
    results: list[SystemResult], overhead: SystemResult | None
) -> list[str]:
    return [
        "| target | measured | status |",
        "|---|---|---|",
        *throughput_rows(results),
        *overhead_rows(overhead),
        *padding_rows(results),
    ]
