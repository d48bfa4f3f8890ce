"""Graphs and padding versus the reference Gaudi stack (issue 26), per configuration.

Each configuration's step trace (``benchmarks/traces/``, recorded from the benchmark
workload by ``benchmarks/step_trace.py``; ``--record`` records them again) is
replayed against several bucket sets, through the runner's own pass split: the
reference's exponential buckets, today's linear ones, the compact set with one row
per prompt, and our default (compact, merged prefill). The targets
are checked on the same steps and printed with the table.
"""

import argparse
import dataclasses
import logging
import subprocess
import sys
from pathlib import Path

from vllm_hpu.bucketing import BucketingConfig, HpuBucketManager, ServingLimits
from vllm_hpu.bucketing.replay import ReplayResult, replay_trace
from vllm_hpu.bucketing.trace import StepTrace
from vllm_hpu.envs import read_envs

TRACES = Path(__file__).parent / "traces"
# Seconds of warmup per graph that Gaudi users report (compile and capture).
GRAPH_COST_S = 14.0
# The graph target for the example configuration: issue 54's (issue 26's was
# 53, half the reference's).
EXAMPLE_GRAPH_TARGET = 40


@dataclasses.dataclass(frozen=True)
class Configuration:
    name: str
    trace: str
    max_num_seqs: int
    max_model_len: int
    num_kv_blocks: int
    max_num_batched_tokens: int = 2048
    block_size: int = 128
    # benchmarks/step_trace.py's workload options (default: the benchmark's).
    workload: tuple[tuple[str, int], ...] = ()


CONFIGURATIONS = (
    # The reference stack's example: prefix caching and chunked prompts on.
    Configuration("example (64 seqs, 4k)", "example.jsonl", 64, 4096, 1000),
    # README_GAUDI's long context; 4000 blocks of 128 is about an 8B model's cache.
    Configuration("long context (32 seqs, 32k)", "long-context.jsonl", 32, 32768, 4000),
    # Small-batch chat: 8 sequences of up to 8k tokens fill 512 blocks.
    Configuration("chat (8 seqs, 8k)", "chat.jsonl", 8, 8192, 512),
    # Not the workload the compact constants were tuned on: long prompts (median
    # 3000 tokens, up to 12k) and short outputs (4 to 32 tokens), as in
    # summarisation or retrieval; long context, so the reference's edge buckets.
    Configuration(
        "long prompts, short outputs (32 seqs, 16k)",
        "long-prompts.jsonl",
        32,
        16384,
        2000,
        workload=(
            ("num-requests", 48),
            ("prompt-median", 3000),
            ("prompt-max", 12000),
            ("output-min", 4),
            ("output-max", 32),
        ),
    ),
)
# Bucket sets compared: name, and the variables that select them. The
# reference's default runs one prompt per pass, its merged mode packs them; the
# linear sets run one row per prompt, as that stack does.
UNPACKED = {"VLLM_HPU_MERGED_PREFILL": "false"}
REFERENCE, REFERENCE_MERGED = "reference", "reference, merged prefill"
STRATEGIES = (
    (REFERENCE, {"VLLM_HPU_BUCKETING_STRATEGY": "reference"}),
    (REFERENCE_MERGED, {"VLLM_HPU_BUCKETING_STRATEGY": "reference-merged"}),
    ("today (linear)", {"VLLM_HPU_BUCKETING_STRATEGY": "linear", **UNPACKED}),
    ("compact, one row per prompt", UNPACKED),
    ("ours (compact, merged prefill, default)", {}),
)
OURS = STRATEGIES[-1][0]


@dataclasses.dataclass(frozen=True)
class Measured:
    name: str
    num_prompt: int
    num_decode: int
    result: ReplayResult

    @property
    def num_graphs(self) -> int:
        return self.num_prompt + self.num_decode


def measure(trace: StepTrace, environ: dict[str, str], name: str) -> Measured:
    limits = ServingLimits(
        trace.max_num_seqs,
        trace.max_num_batched_tokens,
        trace.max_model_len,
        trace.block_size,
        use_context_buckets=True,
    )
    manager = HpuBucketManager(BucketingConfig.from_limits(limits, read_envs(environ)))
    manager.set_num_kv_blocks(trace.num_kv_blocks)
    num_prompt, num_decode = len(manager.prompt_buckets), len(manager.decode_buckets)
    return Measured(name, num_prompt, num_decode, replay_trace(trace, manager))


def row(config: Configuration, measured: Measured) -> str:
    stats, result = measured.result.stats, measured.result
    cells = [
        config.name,
        measured.name,
        f"{measured.num_prompt}+{measured.num_decode} = {measured.num_graphs}",
        f"{measured.num_graphs * GRAPH_COST_S / 60:.0f}",
        f"{stats.prompt.padded} ({stats.prompt.ratio:.1%})",
        f"{stats.decode_batch.padded} ({stats.decode_batch.ratio:.1%})",
        f"{stats.decode_blocks.padded} ({stats.decode_blocks.ratio:.1%})",
        f"{result.passes} ({result.passes_per_step:.3f})",
        str(result.misses),
    ]
    return "| " + " | ".join(cells) + " |"


def checks(config: Configuration, by_name: dict[str, Measured]) -> list[str]:
    """The issue's targets for one configuration: ours against the others. Both
    reference modes warm up the same decode buckets, so decode is checked once."""
    ours, ref = by_name[OURS], by_name[REFERENCE]
    merged_ref = by_name[REFERENCE_MERGED]
    today = by_name["today (linear)"]
    graph_limit = (
        EXAMPLE_GRAPH_TARGET if config.trace == "example.jsonl" else ref.num_graphs // 2
    )
    ours_s = ours.result.stats
    items = [
        (
            f"graphs <= {graph_limit}",
            ours.num_graphs,
            graph_limit,
        ),
        ("graphs <= reference, merged", ours.num_graphs, merged_ref.num_graphs),
        (
            "padded prompt tokens <= reference",
            ours_s.prompt.padded,
            ref.result.stats.prompt.padded,
        ),
        (
            "padded prompt tokens <= reference, merged",
            ours_s.prompt.padded,
            merged_ref.result.stats.prompt.padded,
        ),
        (
            "padded decode sequences <= reference",
            ours_s.decode_batch.padded,
            ref.result.stats.decode_batch.padded,
        ),
        (
            "padded decode blocks <= reference",
            ours_s.decode_blocks.padded,
            ref.result.stats.decode_blocks.padded,
        ),
        ("forward passes <= today", ours.result.passes, today.result.passes),
        ("no pass without a warmed-up bucket", ours.result.misses, 0),
    ]
    return [
        f"| {config.name} | {what} | {got} | {limit} | "
        f"{'met' if got <= limit else 'missed'} |"
        for what, got, limit in items
    ]


def report_rows(traces: Path = TRACES) -> list[str]:
    """The report's section: the table, then the targets checked."""
    logging.disable(logging.WARNING)  # misses of the other sets are counted
    table = [
        "## Graphs and padding versus the reference (issue 26)",
        "",
        "Each configuration's recorded step trace replayed against each bucket set "
        f"through the runner's pass split; warmup at {GRAPH_COST_S:g} s per graph.",
        "",
        "| configuration | buckets | graphs (prompt+decode) | warmup min | padded "
        "prompt tokens | padded decode seqs | padded decode blocks | forward passes "
        "(per step) | not warmed up |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    target_rows = [
        "",
        "| configuration | target | ours | limit | |",
        "|---|---|---|---|---|",
    ]
    for config in CONFIGURATIONS:
        trace = StepTrace.load(traces / config.trace)
        measured = [measure(trace, environ, name) for name, environ in STRATEGIES]
        table += [row(config, m) for m in measured]
        target_rows += checks(config, {m.name: m for m in measured})
    logging.disable(logging.NOTSET)
    return table + target_rows + [""]


def record(traces: Path) -> None:
    """Record every configuration's trace (a minute or so each on two cores)."""
    for config in CONFIGURATIONS:
        workload = [f"--{name}={value}" for name, value in config.workload]
        command = [
            sys.executable, "-m", "benchmarks.step_trace",
            "--out", str(traces / config.trace),
            "--max-num-seqs", str(config.max_num_seqs),
            "--max-num-batched-tokens", str(config.max_num_batched_tokens),
            "--max-model-len", str(config.max_model_len),
            "--block-size", str(config.block_size),
            "--num-kv-blocks", str(config.num_kv_blocks),
            *workload,
        ]  # fmt: skip
        subprocess.run(command, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", action="store_true", help="record the traces again")
    parser.add_argument("--traces", type=Path, default=TRACES)
    args = parser.parse_args()
    if args.record:
        record(args.traces)
    print("\n".join(report_rows(args.traces)))


if __name__ == "__main__":
    main()
