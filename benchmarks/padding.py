"""Padding cost of the default bucket sets on a synthetic serving trace.

Seeded log-normal prompts (~300 tokens) and outputs (~200), a simple continuous
batching loop, replayed through linear and exponential defaults.
"""

import argparse
import dataclasses
import logging
import math
import random

from vllm_hpu.bucketing import (
    BucketingConfig,
    HpuBucketManager,
    ServingLimits,
    TraceStep,
    measure_padding,
)
from vllm_hpu.envs import read_envs

PROMPT_MEDIAN, OUTPUT_MEDIAN, SIGMA = 300, 200, 0.6
LIMITS = ServingLimits(
    max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=4096, block_size=128
)
NUM_KV_BLOCKS = 2048


@dataclasses.dataclass
class Request:
    prompt_len: int
    output_len: int
    generated: int = 0


def make_requests(num_requests: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    # Prompts stay within one step's token budget: this trace has no chunking.
    longest_prompt = LIMITS.max_num_batched_tokens
    longest_output = LIMITS.max_model_len - longest_prompt
    return [
        Request(
            prompt_len=lognormal(rng, PROMPT_MEDIAN, longest_prompt),
            output_len=lognormal(rng, OUTPUT_MEDIAN, longest_output),
        )
        for _ in range(num_requests)
    ]


def lognormal(rng: random.Random, median: int, longest: int) -> int:
    return min(longest, max(1, round(rng.lognormvariate(math.log(median), SIGMA))))


def admit(waiting: list[Request], num_running: int, concurrency: int) -> list[Request]:
    """New prompts for this step: free slots, and the padded batch within budget
    (the runner pads every prompt to the longest, so count * longest must fit)."""
    batch: list[Request] = []
    while waiting and num_running + len(batch) < concurrency:
        longest = max([r.prompt_len for r in batch] + [waiting[0].prompt_len])
        if batch and (len(batch) + 1) * longest > LIMITS.max_num_batched_tokens:
            break
        batch.append(waiting.pop(0))
    return batch


def simulate(requests: list[Request], concurrency: int) -> list[TraceStep]:
    """Each step runs the admitted prompts, then one decode token for the rest."""
    waiting, trace = list(requests), []
    running: list[Request] = []
    while waiting or running:
        decoding = [r for r in running if r.generated < r.output_len]
        prompts = admit(waiting, len(decoding), concurrency)
        if prompts:
            trace.append(TraceStep("prompt", tuple(r.prompt_len for r in prompts)))
        if decoding:
            # The KV of the token being decoded is written this step: +1.
            seq_lens = [r.prompt_len + r.generated + 1 for r in decoding]
            blocks = tuple(math.ceil(n / LIMITS.block_size) for n in seq_lens)
            trace.append(TraceStep("decode", blocks))
        for request in decoding + prompts:
            request.generated += 1
        running = [r for r in decoding + prompts if r.generated < r.output_len]
    return trace


def report(name: str, trace: list[TraceStep], exponential: bool) -> str:
    environ = {"VLLM_EXPONENTIAL_BUCKETING": "1" if exponential else "0"}
    manager = HpuBucketManager(BucketingConfig.from_limits(LIMITS, read_envs(environ)))
    manager.set_num_kv_blocks(NUM_KV_BLOCKS)
    warmed = len(manager.prompt_buckets) + len(manager.decode_buckets)
    sizes = f"{len(manager.prompt_buckets)}+{len(manager.decode_buckets)}"
    stats = measure_padding(trace, manager)
    misses = len(manager.prompt_buckets) + len(manager.decode_buckets) - warmed
    return (
        f"{name:<12}{sizes:>9}{stats.prompt.ratio:>10.1%}"
        f"{stats.decode_batch.ratio:>10.1%}{stats.decode_blocks.ratio:>10.1%}{misses:>8}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    trace = simulate(make_requests(args.num_requests, args.seed), args.concurrency)
    steps = {p: sum(s.phase == p for s in trace) for p in ("prompt", "decode")}
    print(
        f"{args.num_requests} requests, {steps['prompt']} prompt and "
        f"{steps['decode']} decode steps, {args.concurrency} concurrent"
    )
    header = f"{'spacing':<12}{'buckets':>9}{'prompt':>10}"
    print(header + f"{'dec batch':>10}{'dec block':>10}{'misses':>8}")
    for name, exponential in (("linear", False), ("exponential", True)):
        print(report(name, trace, exponential))


if __name__ == "__main__":
    main()
