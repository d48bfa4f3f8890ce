"""Long-context bucket plans (issue 38): graphs and padding for max_model_len
32k, 128k and 1M on long-context step traces (``benchmarks/long_context_trace.py``),
replayed through the runner's own pass split.

Bucket sets compared: the reference Gaudi stack's exponential buckets (one row
per prompt, as it runs), the compact set as it is below 32k (without the
long-context ladders), and the default now (compact, merged prefill, with the
square-root ladders of ``vllm_hpu/bucketing/long_context.py``). Padding is the
share of computed units that were padding: prompt tokens, cached-context blocks
of prompt passes (attention only), decode sequences and decode blocks.

    python -m benchmarks.long_context [--write-traces]
"""

import argparse
import logging
from collections.abc import Callable
from pathlib import Path

from benchmarks.long_context_trace import WORKLOADS, LongWorkload, simulate
from vllm_hpu.bucketing import BucketingConfig, HpuBucketManager, ServingLimits
from vllm_hpu.bucketing.compact import compact_decode_buckets
from vllm_hpu.bucketing.merged_buckets import merged_prompt_buckets
from vllm_hpu.bucketing.replay import ReplayResult, replay_trace
from vllm_hpu.bucketing.trace import StepTrace
from vllm_hpu.envs import read_envs

TRACES = Path(__file__).parent / "traces"
GRAPH_COST_S = 14.0  # warmup seconds per graph that Gaudi users report

Manager = Callable[[LongWorkload], HpuBucketManager]


def _manager(workload: LongWorkload, variables: dict[str, str]) -> HpuBucketManager:
    limits = ServingLimits(
        workload.max_num_seqs,
        workload.max_num_batched_tokens,
        workload.max_model_len,
        workload.block_size,
        use_context_buckets=True,
    )
    manager = HpuBucketManager(
        BucketingConfig.from_limits(limits, read_envs(variables))
    )
    manager.set_num_kv_blocks(workload.num_kv_blocks)
    return manager


def reference(workload: LongWorkload) -> HpuBucketManager:
    variables = {
        "VLLM_HPU_BUCKETING_STRATEGY": "reference",
        "VLLM_HPU_MERGED_PREFILL": "false",
    }
    return _manager(workload, variables)


def compact_alone(workload: LongWorkload) -> HpuBucketManager:
    """The compact set as below 32k, at any max_model_len."""
    manager = _manager(workload, {})
    config = manager.config
    manager.use_buckets(
        merged_prompt_buckets(config),
        compact_decode_buckets(config, workload.num_kv_blocks),
    )
    return manager


def default(workload: LongWorkload) -> HpuBucketManager:
    return _manager(workload, {})


BUCKET_SETS: tuple[tuple[str, Manager], ...] = (
    ("reference", reference),
    ("compact without the long ladders", compact_alone),
    ("**default (long-context ladders)**", default),
)


def row(name: str, manager: HpuBucketManager, result: ReplayResult) -> str:
    stats = result.stats
    graphs = len(manager.prompt_buckets) + len(manager.decode_buckets)
    cells = [
        name,
        f"{len(manager.prompt_buckets)}+{len(manager.decode_buckets)} = {graphs}",
        f"{graphs * GRAPH_COST_S / 60:.0f} min",
        f"{stats.prompt.ratio:.1%}",
        f"{result.context_blocks.ratio:.1%}",
        f"{stats.decode_batch.ratio:.1%}",
        f"{stats.decode_blocks.ratio:.1%}",
        str(max(bucket.num_blocks for bucket in manager.decode_buckets)),
        str(result.passes),
        str(result.misses),
    ]
    return "| " + " | ".join(cells) + " |"


def check_decode_caps(manager: HpuBucketManager, workload: LongWorkload) -> None:
    """No decode bucket of ours asks for more blocks than the KV cache holds
    (the reference's ladder reaches 3 x the cache: its column shows it)."""
    most = max(bucket.num_blocks for bucket in manager.decode_buckets)
    if most > workload.num_kv_blocks:
        raise SystemExit(
            f"{workload.name}: a decode bucket of {most} blocks exceeds the "
            f"{workload.num_kv_blocks} blocks of the KV cache"
        )


def report(workload: LongWorkload, trace: StepTrace) -> list[str]:
    lines = [
        f"### {workload.name}: max_model_len {workload.max_model_len}, "
        f"{workload.max_num_seqs} seqs, {workload.max_num_batched_tokens} tokens "
        f"per step, {workload.num_kv_blocks} KV blocks, {len(trace.steps)} steps",
        "",
        "| buckets | graphs | warmup at 14 s | padded prompt tokens | padded "
        "context blocks | padded decode seqs | padded decode blocks | largest "
        "decode bucket (blocks) | passes | not warmed up |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, make in BUCKET_SETS:
        manager = make(workload)
        if make is not reference:
            check_decode_caps(manager, workload)
        lines.append(row(name, manager, replay_trace(trace, manager)))
    return lines


def main() -> None:
    logging.disable(logging.INFO)  # the managers log every bucket list
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--write-traces",
        action="store_true",
        help="also save the traces as benchmarks/traces/long-context-<name>.jsonl",
    )
    args = parser.parse_args()
    for workload in WORKLOADS:
        trace = simulate(workload)
        if args.write_traces:
            trace.save(TRACES / f"long-context-{workload.name.lower()}.jsonl")
        print("\n".join(report(workload, trace)) + "\n")


if __name__ == "__main__":
    main()
