"""The benchmark's Markdown report and PNG plots, from each system's SystemResult."""

import dataclasses
import importlib.metadata
import platform
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI
import matplotlib.pyplot as plt

from benchmarks import graphs, targets
from benchmarks.results_schema import PROFILE_ALL, SystemResult
from benchmarks.systems import BASELINE


@dataclasses.dataclass(frozen=True)
class RunContext:
    stamp: str  # <date>-<dtype>[-quick]: names every file of the run
    dtype: str
    threads: int
    workload: str  # one line describing the requests


def _cell(value: float | None, fmt: str, scale: float = 1.0) -> str:
    return "n/a" if value is None else format(value * scale, fmt)


def _pair(summary: dict[str, float] | None, fmt: str, scale: float) -> str:
    if summary is None:
        return "n/a"
    return f"{summary['median'] * scale:{fmt}} / {summary['p99'] * scale:{fmt}}"


def _buckets(result: SystemResult) -> str:
    if result.buckets is None:
        return "n/a"
    b = result.buckets
    return f"{b['prompt']}+{b['decode']} ({b['shapes_run']} run)"


def _padding(result: SystemResult) -> str:
    if result.padding is None:
        return "n/a"
    p = result.padding
    return f"{p['prompt']:.1%} / {p['decode_batch']:.1%} / {p['decode_blocks']:.1%}"


def system_row(result: SystemResult, baseline: SystemResult | None) -> str:
    if result.status != "ok":
        return f"| {result.system} | {result.status}: {result.note} |" + " |" * 9
    speedup = targets.speedup(result, baseline)
    cells = [
        result.system,
        _cell(targets.tokens_per_s(result), ".1f"),
        _cell(targets.requests_per_s(result), ".2f"),
        _cell(speedup, ".1f") + ("x" if speedup is not None else ""),
        _pair(result.ttft_s, ".2f", 1.0),
        _pair(result.itl_s, ".0f", 1e3),
        _cell(result.startup_s, ".1f"),
        _cell(result.warmup_s, ".1f"),
        _buckets(result),
        _padding(result),
        result.note,
    ]
    return "| " + " | ".join(cells) + " |"


SYSTEM_HEADER = (
    "| system | output tok/s | req/s | vs transformers | TTFT median / p99 (s) "
    "| ITL median / p99 (ms) | startup (s) | warmup (s) | buckets prompt+decode "
    "(shapes run) | padding prompt / decode batch / decode blocks | note |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)
OVERHEAD_HEADER = (
    "| decode batch | runner overhead (ms) | sampler (ms) | model forward (ms) "
    "| lm_head (ms) | steps |\n|---|---|---|---|---|---|"
)


def overhead_rows(overhead: SystemResult | None) -> list[str]:
    if overhead is None or overhead.status != "ok" or not overhead.overhead:
        note = overhead.note if overhead is not None else "not measured"
        return [f"Runner overhead: {note}"]
    rows = [OVERHEAD_HEADER]
    for o in overhead.overhead:
        rows.append(
            f"| {o['batch_size']} | {o['input_and_output_ms']:.2f} "
            f"| {o['sampler_ms']:.2f} | {o['forward_ms']:.1f} | {o['logits_ms']:.1f} "
            f"| {o['steps']} |"
        )
    return rows


TOP_OPERATORS = 12


def _operator_seconds(
    split: dict[str, dict[str, float]], regions: list[str], names: list[str]
) -> list[float]:
    """Seconds of ``names`` in all, then in each of ``regions``."""
    parts = [split[PROFILE_ALL], *(split[r] for r in regions)]
    return [sum(part.get(name, 0.0) for name in names) for part in parts]


def _seconds_row(label: str, seconds: list[float], total: float) -> str:
    cells = [label, f"{seconds[0]:.1f}", f"{seconds[0] / total:.0%}"]
    cells += [f"{s:.1f}" for s in seconds[1:]]
    return "| " + " | ".join(cells) + " |"


def profile_rows(profile: SystemResult | None) -> list[str]:
    """The profiled run's operators by their own time, in all and per attention
    region; nothing when the run was not profiled."""
    if profile is None:
        return []
    heading = f"## Where the time goes ({profile.system}, under torch.profiler)"
    if profile.status != "ok" or not profile.profile:
        return [heading, "", f"Profile: {profile.note}", ""]
    split = profile.profile
    every = split[PROFILE_ALL]
    regions = sorted(key for key in split if key != PROFILE_ALL)
    total = sum(every.values())
    ranked = sorted(every, key=every.__getitem__, reverse=True)
    rest = ranked[TOP_OPERATORS:]
    columns = [f"in {region} (s)" for region in regions]

    def row(label: str, names: list[str]) -> str:
        return _seconds_row(label, _operator_seconds(split, regions, names), total)

    return [
        heading,
        "",
        f"Operators' own time over the workload: {total:.1f} s, in a run of "
        f"{profile.elapsed_s or 0:.1f} s (the profiler slows it).",
        "",
        "| " + " | ".join(["operator", "s", "share", *columns]) + " |",
        "|---" * (3 + len(columns)) + "|",
        *(row(f"`{name}`", [name]) for name in ranked[:TOP_OPERATORS]),
        row(f"{len(rest)} other operators", rest),
        row("all operators", ranked),
        "",
    ]


def machine_line(context: RunContext) -> str:
    versions = ", ".join(
        f"{name} {importlib.metadata.version(name)}"
        for name in ("vllm", "torch", "transformers")
    )
    return (
        f"{platform.processor() or platform.machine()}, {_cpu_model()}, "
        f"{context.threads} torch threads per system, one process each; {versions}"
    )


# What emulation's speed hangs on: oneDNN packs bf16 only with AVX-512 (or newer).
VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile")


def _cpu_model() -> str:
    """The CPU's name and which of VECTOR_FLAGS it has."""
    fields: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    present = [flag for flag in VECTOR_FLAGS if flag in flags]
    return (
        f"{fields.get('model name', 'unknown CPU')} ({' '.join(present) or 'no AVX2'})"
    )


def markdown(
    context: RunContext,
    results: list[SystemResult],
    overhead: SystemResult | None,
    profile: SystemResult | None = None,
) -> str:
    baseline = next((r for r in results if r.system == BASELINE), None)
    lines = [
        f"# Benchmark {context.stamp}: SmolLM2-135M-Instruct, {context.dtype}",
        "",
        f"Machine: {machine_line(context)}.",
        f"Workload: {context.workload}; greedy, EOS ignored, all requests at t=0.",
        "",
        SYSTEM_HEADER,
        *(system_row(r, baseline) for r in results),
        "",
        "Output tokens count each request's own output length. TTFT is from the "
        "start of the run (every request arrives then); ITL is every gap between "
        "consecutive tokens of a request as the caller received them. "
        "transformers: token times from a per-step logits processor; "
        f"{_waste(baseline)}",
        "",
        f"![throughput and latency per system]({context.stamp}-systems.png)",
        "",
        "## Runner overhead per decode step (median)",
        "",
        *overhead_rows(overhead),
        "",
        f"![runner overhead versus batch size]({context.stamp}-overhead.png)",
        "",
        "Runner overhead = execute_model + sample_tokens - model forward - lm_head "
        "- sampler: input preparation and output processing on the host.",
        "",
        *profile_rows(profile),
        *graphs.report_rows(),
        "## Targets",
        "",
        *targets.target_rows(results, overhead),
        "",
    ]
    return "\n".join(lines)


def _waste(baseline: SystemResult | None) -> str:
    if baseline is None or baseline.status != "ok" or not baseline.computed_tokens:
        return ""
    share = 1 - baseline.output_tokens / baseline.computed_tokens
    return (
        f"it computed {baseline.computed_tokens} tokens for {baseline.output_tokens} "
        f"useful ones ({share:.0%} spent on rows already done)."
    )


def plot_systems(results: list[SystemResult], path: Path) -> None:
    ok = [r for r in results if r.status == "ok"]
    names = [textwrap.fill(r.system, 14) for r in ok]
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    axes[0].bar(names, [targets.tokens_per_s(r) or 0 for r in ok], color="tab:blue")
    axes[0].set_title("output tokens/s (higher is better)")
    for axis, field, scale, unit in (
        (axes[1], "ttft_s", 1.0, "s"),
        (axes[2], "itl_s", 1e3, "ms"),
    ):
        summaries = [getattr(r, field) or {"median": 0, "p99": 0} for r in ok]
        x = range(len(ok))
        axis.bar([i - 0.2 for i in x], [s["median"] * scale for s in summaries], 0.4)
        axis.bar([i + 0.2 for i in x], [s["p99"] * scale for s in summaries], 0.4)
        axis.set_xticks(list(x), names)
        axis.legend(["median", "p99"])
        axis.set_title(f"{field.split('_')[0].upper()} ({unit}, lower is better)")
    for axis in axes:
        axis.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_overhead(overhead: SystemResult, path: Path) -> None:
    rows = overhead.overhead or []
    sizes = [o["batch_size"] for o in rows]
    fig, axis = plt.subplots(figsize=(6, 4))
    axis.plot(sizes, [o["input_and_output_ms"] for o in rows], "o-", label="runner")
    axis.plot(sizes, [o["sampler_ms"] for o in rows], "s--", label="sampler")
    axis.axhline(targets.OVERHEAD_TARGET_MS, color="red", lw=0.8, label="2 ms target")
    axis.set_xscale("log", base=2)
    axis.set_xlabel("decode batch size")
    axis.set_ylabel("ms per decode step (median)")
    axis.set_title("Runner overhead outside the model forward")
    axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(
    context: RunContext,
    results: list[SystemResult],
    overhead: SystemResult | None,
    directory: Path,
    profile: SystemResult | None = None,
) -> Path:
    """Write <stamp>.md and its plots under ``directory``; print the Markdown."""
    text = markdown(context, results, overhead, profile)
    plot_systems(results, directory / f"{context.stamp}-systems.png")
    if overhead is not None and overhead.status == "ok":
        plot_overhead(overhead, directory / f"{context.stamp}-overhead.png")
    path = directory / f"{context.stamp}.md"
    path.write_text(text)
    print(text)
    print(f"Report: {path}")
    return path
