"""Padding and graphs of the default buckets on recorded step traces (issue 54).

Each workload's step trace is replayed through the runner's own pass split
against several bucket sets; one table, one row per workload and set:
graphs (prompt + decode) and their warmup at GRAPH_COST_S per graph (what
Gaudi users report; emulation compiles nothing per shape), then the share of
each padded dimension: prompt tokens, cached-context blocks of prompt passes,
decode rows (tokens) and decode blocks; forward passes, and passes that found
no warmed-up bucket.

Workloads: ``make run`` (examples/offline_inference.py, recorded with
``VLLM_HPU_BUCKET_TRACE``), the three configurations of benchmarks/graphs.py
(chat, long context, the reference stack's example configuration), its long
prompts, and a seeded synthetic server under steady load (2000 requests, 64 at
a time, no prefix caching) that keeps the batch full.

Bucket sets: the reference Gaudi stack's (its default, one prompt per pass,
and its merged-prefill mode), the compact default before issue 54 (figures
recorded by this script at commit 6502fad: ``PYTHONPATH=<a checkout of it>
python -m benchmarks.padding --sets compact``) and the compact default now;
``--sets linear exponential`` adds the range strategies.

    python -m benchmarks.padding [--sets reference compact ...]
"""

import argparse
import dataclasses
import logging
import math
import random
from pathlib import Path

from vllm_hpu.bucketing import BucketingConfig, HpuBucketManager, ServingLimits
from vllm_hpu.bucketing.replay import ReplayResult, replay_trace
from vllm_hpu.bucketing.trace import PromptChunk, StepShape, StepTrace
from vllm_hpu.envs import read_envs

TRACES = Path(__file__).parent / "traces"
GRAPH_COST_S = 14.0
# The synthetic server: log-normal prompts (~300 tokens) and outputs (~200).
PROMPT_MEDIAN, OUTPUT_MEDIAN, SIGMA = 300, 200, 0.6
SYNTHETIC = ServingLimits(64, 2048, 4096, 128)
SYNTHETIC_KV_BLOCKS = 2048

WORKLOADS = (
    ("make run (8 seqs, 2k)", "make-run.jsonl"),
    ("chat (8 seqs, 8k)", "chat.jsonl"),
    ("long context (32 seqs, 32k)", "long-context.jsonl"),
    ("example (64 seqs, 4k)", "example.jsonl"),
    ("long prompts (32 seqs, 16k)", "long-prompts.jsonl"),
    ("steady load (64 seqs, 4k)", None),
)
SETS = {
    "reference": {"VLLM_HPU_BUCKETING_STRATEGY": "reference"},
    "reference-merged": {"VLLM_HPU_BUCKETING_STRATEGY": "reference-merged"},
    "linear": {"VLLM_HPU_BUCKETING_STRATEGY": "linear"},
    "exponential": {"VLLM_HPU_BUCKETING_STRATEGY": "exponential"},
    "compact": {},
}
BEFORE = "compact before issue 54"
# The compact default at 6502fad, replayed by this script: graphs (prompt,
# decode), then padded prompt tokens, context blocks, decode rows, decode
# blocks (%), and passes.
RECORDED_BEFORE = {
    "make run (8 seqs, 2k)": (18, 16, 40.2, 0.0, 14.8, 66.2, 68),
    "chat (8 seqs, 8k)": (18, 16, 20.4, 0.0, 1.7, 15.4, 1321),
    "long context (32 seqs, 32k)": (49, 78, 12.6, 62.5, 6.7, 14.9, 456),
    "example (64 seqs, 4k)": (18, 28, 2.3, 90.6, 16.3, 15.8, 258),
    "long prompts (32 seqs, 16k)": (18, 24, 0.4, 80.0, 17.5, 78.4, 228),
    "steady load (64 seqs, 4k)": (9, 28, 16.2, 0.0, 0.9, 25.9, 9483),
}


@dataclasses.dataclass
class Request:
    prompt_len: int
    output_len: int
    generated: int = 0


def lognormal(rng: random.Random, median: int, longest: int) -> int:
    return min(longest, max(1, round(rng.lognormvariate(math.log(median), SIGMA))))


def make_requests(num_requests: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    longest_prompt = SYNTHETIC.max_num_batched_tokens - SYNTHETIC.max_num_seqs
    longest_output = SYNTHETIC.max_model_len - longest_prompt
    return [
        Request(
            lognormal(rng, PROMPT_MEDIAN, longest_prompt),
            lognormal(rng, OUTPUT_MEDIAN, longest_output),
        )
        for _ in range(num_requests)
    ]


def simulate(requests: list[Request]) -> StepTrace:
    """Continuous batching as vLLM schedules it: each step decodes one token
    for every running request, then admits whole prompts into free slots
    while the step's token budget lasts."""
    waiting, running, steps = list(requests), [], []
    block_size = SYNTHETIC.block_size
    while waiting or running:
        budget = SYNTHETIC.max_num_batched_tokens - len(running)
        admitted: list[Request] = []
        while waiting and len(running) + len(admitted) < SYNTHETIC.max_num_seqs:
            if waiting[0].prompt_len > budget:
                break
            budget -= waiting[0].prompt_len
            admitted.append(waiting.pop(0))
        # The KV of the token being decoded is written this step: +1.
        decode = [
            math.ceil((r.prompt_len + r.generated + 1) / block_size) for r in running
        ]
        prompts = [PromptChunk(r.prompt_len, 0) for r in admitted]
        steps.append(StepShape(tuple(prompts), tuple(decode)))
        for request in running + admitted:
            request.generated += 1
        running = [r for r in running + admitted if r.generated < r.output_len]
    return StepTrace(
        block_size=block_size,
        max_num_seqs=SYNTHETIC.max_num_seqs,
        max_num_batched_tokens=SYNTHETIC.max_num_batched_tokens,
        max_model_len=SYNTHETIC.max_model_len,
        num_kv_blocks=SYNTHETIC_KV_BLOCKS,
        steps=tuple(steps),
    )


def load(trace_file: str | None, num_requests: int) -> tuple[StepTrace, bool]:
    """A workload's trace, and whether context buckets are in use (prefix
    caching or chunked prompts; vLLM's default, off for the synthetic one)."""
    if trace_file is None:
        return simulate(make_requests(num_requests, seed=0)), False
    return StepTrace.load(TRACES / trace_file), True


def measure(
    trace: StepTrace, with_context: bool, environ: dict[str, str]
) -> tuple[HpuBucketManager, ReplayResult]:
    limits = ServingLimits(
        trace.max_num_seqs,
        trace.max_num_batched_tokens,
        trace.max_model_len,
        trace.block_size,
        use_context_buckets=with_context,
    )
    config = BucketingConfig.from_limits(limits, read_envs(environ))
    manager = HpuBucketManager(config, exact_shapes=False)
    manager.set_num_kv_blocks(trace.num_kv_blocks)
    return manager, replay_trace(trace, manager)


def row(workload: str, name: str, figures: tuple[float, ...]) -> str:
    prompt, decode, *padding, passes = figures
    graphs = prompt + decode
    cells = [
        workload,
        name,
        f"{prompt:.0f}+{decode:.0f} = {graphs:.0f}",
        f"{graphs * GRAPH_COST_S:.0f}",
        *(f"{value:.1f}%" for value in padding),
        f"{passes:.0f}",
    ]
    return "| " + " | ".join(cells) + " |"


def figures(manager: HpuBucketManager, result: ReplayResult) -> tuple[float, ...]:
    stats = result.stats
    padding = (
        stats.prompt.ratio,
        result.context_blocks.ratio,
        stats.decode_batch.ratio,
        stats.decode_blocks.ratio,
    )
    return (
        len(manager.prompt_buckets),
        len(manager.decode_buckets),
        *(100 * ratio for ratio in padding),
        result.passes,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sets", nargs="+", choices=[*SETS, BEFORE], default=None)
    parser.add_argument("--num-requests", type=int, default=2000)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the managers log every bucket list
    names = args.sets or ["reference", "reference-merged", BEFORE, "compact"]
    print(
        "| workload | buckets | graphs | warmup s at 14 s/graph | padded prompt "
        "tokens | padded context blocks | padded decode rows | padded decode "
        "blocks | passes |\n|---|---|---|---|---|---|---|---|---|"
    )
    misses = []
    for workload, trace_file in WORKLOADS:
        trace, with_context = load(trace_file, args.num_requests)
        for name in names:
            if name == BEFORE:
                print(row(workload, f"{name} (recorded)", RECORDED_BEFORE[workload]))
                continue
            manager, result = measure(trace, with_context, SETS[name])
            print(row(workload, name, figures(manager, result)))
            if result.misses:
                misses.append(f"{workload}, {name}: {result.misses}")
    print("\nPasses without a warmed-up bucket: " + ("; ".join(misses) or "none"))


if __name__ == "__main__":
    main()
