"""Graphs and padding versus the reference Gaudi stack (issue 26), per configuration.

Each configuration's step trace (``benchmarks/traces/``, recorded from the benchmark
workload by ``benchmarks/step_trace.py``; ``--record`` records them again) is
replayed against several bucket sets, through the runner's own pass split: the
reference's exponential buckets, today's linear ones, and our default. The targets
are checked on the same steps and printed with the table.
"""

import argparse
import dataclasses
import logging
import math
import subprocess
import sys
from pathlib import Path

from vllm_hpu.bucketing import BucketingConfig, HpuBucketManager, ServingLimits
from vllm_hpu.bucketing.padding import PaddingCounter
from vllm_hpu.bucketing.ranges import cover_value
from vllm_hpu.bucketing.reference import log2_limit, reference_range
from vllm_hpu.bucketing.replay import ReplayResult, replay_trace
from vllm_hpu.bucketing.trace import StepTrace
from vllm_hpu.envs import read_envs

TRACES = Path(__file__).parent / "traces"
# Seconds of warmup per graph that Gaudi users report (compile and capture).
GRAPH_COST_S = 14.0
# The graph target for the example configuration: half the reference's.
EXAMPLE_GRAPH_TARGET = 53


@dataclasses.dataclass(frozen=True)
class Configuration:
    name: str
    trace: str
    max_num_seqs: int
    max_model_len: int
    num_kv_blocks: int
    max_num_batched_tokens: int = 2048
    block_size: int = 128


CONFIGURATIONS = (
    # The reference stack's example: prefix caching and chunked prompts on.
    Configuration("example (64 seqs, 4k)", "example.jsonl", 64, 4096, 1000),
    # README_GAUDI's long context; 4000 blocks of 128 is about an 8B model's cache.
    Configuration("long context (32 seqs, 32k)", "long-context.jsonl", 32, 32768, 4000),
    # Small-batch chat: 8 sequences of up to 8k tokens fill 512 blocks.
    Configuration("chat (8 seqs, 8k)", "chat.jsonl", 8, 8192, 512),
)
# Bucket sets compared: name, and the variables that select them.
STRATEGIES = (
    ("reference", {"VLLM_HPU_BUCKETING_STRATEGY": "reference"}),
    ("today (linear)", {"VLLM_HPU_BUCKETING_STRATEGY": "linear"}),
    ("ours (compact, default)", {}),
)


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


def merged_prefill_projection(trace: StepTrace, decode: Measured) -> Measured:
    """What merged prefill would give (not implemented: it changes the runner and
    the prompt mask): each step's chunks packed into one pass of their total tokens,
    padded to the reference's query ladder, with context padded to 0 or the most
    one request can have (a pack with more context is split in two)."""
    block_size = trace.block_size
    token_ladder = reference_range(
        block_size,
        block_size,
        trace.max_num_batched_tokens,
        log2_limit(trace.max_num_batched_tokens) - 2,
    )
    most_context = math.ceil((trace.max_model_len - 1) / block_size)
    result = ReplayResult(stats=decode.result.stats)
    result.stats.prompt = PaddingCounter()
    for step in trace.steps:
        if not (step.prompts or step.decode_blocks):
            continue
        tokens = sum(chunk.query_len for chunk in step.prompts)
        context = sum(chunk.context_blocks(block_size) for chunk in step.prompts)
        num_passes = bool(step.decode_blocks) + (
            math.ceil(context / most_context) if context else bool(step.prompts)
        )
        if step.prompts:
            result.stats.prompt.add(tokens, cover_value(token_ladder, tokens))
        result.steps += 1
        result.passes += num_passes
    num_prompt = len(token_ladder) * 2
    return Measured(
        "merged prefill (projection)", num_prompt, decode.num_decode, result
    )


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
    """The issue's targets for one configuration: ours against the others."""
    ours, ref = by_name["ours (compact, default)"], by_name["reference"]
    today = by_name["today (linear)"]
    graph_limit = (
        EXAMPLE_GRAPH_TARGET if config.trace == "example.jsonl" else ref.num_graphs // 2
    )
    ours_s, ref_s = ours.result.stats, ref.result.stats
    items = [
        (
            f"graphs <= {graph_limit}",
            ours.num_graphs,
            graph_limit,
            ours.num_graphs <= graph_limit,
        ),
        (
            "padded prompt tokens <= reference",
            ours_s.prompt.padded,
            ref_s.prompt.padded,
            ours_s.prompt.padded <= ref_s.prompt.padded,
        ),
        (
            "padded decode sequences <= reference",
            ours_s.decode_batch.padded,
            ref_s.decode_batch.padded,
            ours_s.decode_batch.padded <= ref_s.decode_batch.padded,
        ),
        (
            "padded decode blocks <= reference",
            ours_s.decode_blocks.padded,
            ref_s.decode_blocks.padded,
            ours_s.decode_blocks.padded <= ref_s.decode_blocks.padded,
        ),
        (
            "forward passes <= today",
            ours.result.passes,
            today.result.passes,
            ours.result.passes <= today.result.passes,
        ),
        (
            "no pass without a warmed-up bucket",
            ours.result.misses,
            0,
            ours.result.misses == 0,
        ),
    ]
    return [
        f"| {config.name} | {what} | {got} | {limit} | {'met' if ok else 'missed'} |"
        for what, got, limit, ok in items
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
        measured.append(merged_prefill_projection(trace, measure(trace, {}, "ours")))
        table += [row(config, m) for m in measured]
        target_rows += checks(config, {m.name: m for m in measured})
    logging.disable(logging.NOTSET)
    return table + target_rows + [""]


def record(traces: Path) -> None:
    """Record every configuration's trace (a minute or so each on two cores)."""
    for config in CONFIGURATIONS:
        command = [
            sys.executable, "-m", "benchmarks.step_trace",
            "--out", str(traces / config.trace),
            "--max-num-seqs", str(config.max_num_seqs),
            "--max-num-batched-tokens", str(config.max_num_batched_tokens),
            "--max-model-len", str(config.max_model_len),
            "--block-size", str(config.block_size),
            "--num-kv-blocks", str(config.num_kv_blocks),
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
