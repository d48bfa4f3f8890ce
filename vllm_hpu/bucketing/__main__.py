"""``python -m vllm_hpu.bucketing``: the buckets a configuration would warm up,
before any start: counts, the warmup time they cost, and with ``--trace`` the
padding they give a recorded trace; ``--plan-out`` plans buckets for the trace.

The VLLM_*_BUCKET_* variables apply as in the server; nothing is loaded or run.
"""

import argparse
import dataclasses
import logging
import math
from collections.abc import Sequence
from pathlib import Path

from vllm_hpu import envs
from vllm_hpu.bucketing.bucket_file import BucketSets, write_bucket_file
from vllm_hpu.bucketing.manager import HpuBucketManager
from vllm_hpu.bucketing.settings import BucketingConfig, ServingLimits
from vllm_hpu.bucketing.trace import StepTrace

# vLLM's scheduler defaults and the plugin's block size, so a bare call is typical.
DEFAULTS = {
    "max_num_seqs": 128,
    "max_num_batched_tokens": 2048,
    "max_model_len": 4096,
    "block_size": 128,
}
# What Gaudi users report one bucket's warmup costs (compile and capture), seconds.
DEFAULT_GRAPH_COST_S = 14.0
STRATEGIES = ("compact", "linear", "exponential", "reference", "reference-merged")
PASS_KINDS = {
    True: "merged prefill (a step's prompts packed into one sequence)",
    False: "one padded row per prompt",
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_hpu.bucketing", description=__doc__
    )
    for name in DEFAULTS:
        parser.add_argument(
            "--" + name.replace("_", "-"),
            type=int,
            help=f"default: the trace's, else {DEFAULTS[name]}",
        )
    parser.add_argument(
        "--num-kv-blocks",
        type=int,
        help="KV cache capacity in blocks (default: the trace's, else enough "
        "for every sequence)",
    )
    for flag in ("prefix-caching", "chunked-prefill"):
        parser.add_argument(
            "--" + flag,
            action=argparse.BooleanOptionalAction,
            default=True,
            help=f"{flag.replace('-', ' ')} on, as in vLLM (adds context buckets)",
        )
    parser.add_argument(
        "--exponential",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="exponential spacing (default: VLLM_EXPONENTIAL_BUCKETING)",
    )
    parser.add_argument(
        "--strategy", choices=STRATEGIES, help="default: VLLM_HPU_BUCKETING_STRATEGY"
    )
    parser.add_argument("--bucket-file", help="default: VLLM_BUCKETING_FROM_FILE")
    parser.add_argument(
        "--merged-prefill",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="pack prompt passes (default: VLLM_HPU_MERGED_PREFILL)",
    )
    parser.add_argument(
        "--trace", type=Path, help="a step trace (VLLM_HPU_BUCKET_TRACE) to replay"
    )
    parser.add_argument(
        "--graph-cost-s",
        type=float,
        default=DEFAULT_GRAPH_COST_S,
        help="warmup seconds per bucket, for the estimate (default: %(default)s)",
    )
    parser.add_argument(
        "--plan-out", type=Path, help="plan buckets for --trace, write them here"
    )
    parser.add_argument(
        "--budget", type=int, default=53, help="graphs the plan may use (%(default)s)"
    )
    return parser.parse_args(argv)


def chosen_envs(args: argparse.Namespace) -> envs.HpuEnvs:
    """The process's variables, with the strategy options of the command line."""
    overrides: dict[str, object] = {}
    if args.exponential is not None:
        overrides["exponential_bucketing"] = args.exponential
    if args.strategy is not None:
        overrides["bucketing_strategy"] = args.strategy
        overrides["exponential_bucketing"] = None
    if args.bucket_file is not None:
        overrides["bucketing_from_file"] = args.bucket_file
    if args.merged_prefill is not None:
        overrides["merged_prefill"] = args.merged_prefill
    return dataclasses.replace(envs.get_envs(), **overrides)  # type: ignore[arg-type]


def serving_limits(args: argparse.Namespace, trace: StepTrace | None) -> ServingLimits:
    values = {}
    for name, default in DEFAULTS.items():
        given = getattr(args, name)
        values[name] = given if given is not None else getattr(trace, name, default)
    return ServingLimits(
        **values,
        use_context_buckets=args.prefix_caching or args.chunked_prefill,
        prefix_caching=args.prefix_caching,
    )


def build_manager(
    args: argparse.Namespace, trace: StepTrace | None = None
) -> HpuBucketManager:
    limits = serving_limits(args, trace)
    manager = HpuBucketManager(BucketingConfig.from_limits(limits, chosen_envs(args)))
    num_kv_blocks = args.num_kv_blocks
    if num_kv_blocks is None and trace is not None:
        num_kv_blocks = trace.num_kv_blocks
    if num_kv_blocks is None:
        num_kv_blocks = limits.max_num_seqs * math.ceil(
            limits.max_model_len / limits.block_size
        )
    manager.set_num_kv_blocks(num_kv_blocks)
    return manager


def strategy_name(config: BucketingConfig) -> str:
    if config.prompt_strategy == config.decode_strategy:
        return config.prompt_strategy
    return f"prompt {config.prompt_strategy}, decode {config.decode_strategy}"


def report(
    manager: HpuBucketManager, graph_cost_s: float = DEFAULT_GRAPH_COST_S
) -> str:
    """Bucket counts and the warmup they cost (the buckets themselves are logged)."""
    num_prompt, num_decode = len(manager.prompt_buckets), len(manager.decode_buckets)
    total = num_prompt + num_decode
    minutes = total * graph_cost_s / 60
    return (
        f"{total} buckets ({strategy_name(manager.config)}): {num_prompt} prompt + "
        f"{num_decode} decode\n"
        f"warmup: {total} forward steps, then up to {total} graph captures as the "
        f"graph memory budget allows; at {graph_cost_s:g} s per bucket about "
        f"{minutes:.0f} min\n"
        f"prompt passes: {PASS_KINDS[manager.config.merged_prefill]}"
    )


def trace_report(manager: HpuBucketManager, trace: StepTrace) -> str:
    """Expected padding and passes of the trace's steps with these buckets."""
    from vllm_hpu.bucketing.replay import replay_trace

    result = replay_trace(trace, manager)
    stats = result.stats
    return (
        f"trace: {result.steps} steps, {result.passes} forward passes "
        f"({result.passes_per_step:.3f} per step, at most {result.max_passes}), "
        f"{result.misses} not warmed up\n"
        f"padding: prompt {stats.prompt.describe('tokens')}; decode batch "
        f"{stats.decode_batch.describe('sequences')}, blocks "
        f"{stats.decode_blocks.describe('blocks')}"
    )


def plan(args: argparse.Namespace, trace: StepTrace) -> HpuBucketManager:
    """Plan buckets for the trace, write them, and return a manager using them."""
    from vllm_hpu.bucketing.bucket_planner import plan_buckets

    manager = build_manager(args, trace)
    sets = plan_buckets(trace, manager.config, args.budget)
    header = (
        f"Planned by python -m vllm_hpu.bucketing for {args.trace} "
        f"(budget {args.budget} graphs).\nUse: VLLM_BUCKETING_FROM_FILE={args.plan_out}"
    )
    write_bucket_file(args.plan_out, BucketSets(*sets), header)
    print(f"wrote {len(sets.prompt)} + {len(sets.decode)} buckets to {args.plan_out}")
    args.bucket_file = str(args.plan_out)
    return build_manager(args, trace)


def main(argv: Sequence[str] | None = None) -> None:
    # The manager logs each phase's config and bucket list, as the server does.
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args(argv)
    trace = StepTrace.load(args.trace) if args.trace else None
    if args.plan_out is not None:
        if trace is None:
            raise SystemExit("--plan-out needs --trace: the plan fits a recorded trace")
        manager = plan(args, trace)
    else:
        manager = build_manager(args, trace)
    print(report(manager, args.graph_cost_s))
    if trace is not None:
        print(trace_report(manager, trace))


if __name__ == "__main__":
    main()
