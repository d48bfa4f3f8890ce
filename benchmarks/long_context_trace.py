"""Long-context step traces: a seeded workload of long prompts run through a model
of vLLM's scheduler (chunked prefill, prefix hits, continuous batching), written
as the runner's step traces (``VLLM_HPU_BUCKET_TRACE`` format) for 32k, 128k and
1M token contexts. ``benchmarks/long_context.py`` replays them against bucket sets.

Workload per configuration: prompts log-uniform from 1k tokens to the longest
that leaves room for the output, outputs log-uniform from 64 to 1024 tokens, and
a quarter of the requests extending an earlier prompt (a document asked again:
its whole blocks are a prefix-cache hit). The scheduler model follows vLLM V1:
running requests first (a decode takes one token, a chunked prompt what is left
of the budget), then waiting ones while sequences and KV blocks allow.
"""

import dataclasses
import math
import random

from vllm_hpu.bucketing.trace import PromptChunk, StepShape, StepTrace

MIN_PROMPT, MIN_OUTPUT, MAX_OUTPUT = 1024, 64, 1024
PREFIX_SHARE = 0.25  # requests that extend an earlier prompt
MAX_SUFFIX = 4096  # tokens such a request adds to the earlier prompt


@dataclasses.dataclass(frozen=True)
class LongWorkload:
    name: str
    max_model_len: int
    max_num_seqs: int
    num_kv_blocks: int
    num_requests: int
    max_num_batched_tokens: int = 8192
    block_size: int = 128
    seed: int = 38


@dataclasses.dataclass
class Request:
    prompt_len: int
    output_len: int
    # The earlier request whose whole prompt this one extends (a prefix hit
    # once that prompt is computed), or None.
    extends: "Request | None" = None
    computed: int = 0
    generated: int = 0

    @property
    def prefilling(self) -> bool:
        return self.computed < self.prompt_len


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    return round(math.exp(rng.uniform(math.log(low), math.log(max(low, high)))))


def make_requests(workload: LongWorkload) -> list[Request]:
    rng = random.Random(workload.seed)
    longest = workload.max_model_len - MAX_OUTPUT
    requests: list[Request] = []
    for _ in range(workload.num_requests):
        output_len = _log_uniform(rng, MIN_OUTPUT, MAX_OUTPUT)
        if requests and rng.random() < PREFIX_SHARE:
            earlier = rng.choice(requests)
            prompt_len = min(
                longest, earlier.prompt_len + _log_uniform(rng, 64, MAX_SUFFIX)
            )
            requests.append(Request(prompt_len, output_len, earlier))
        else:
            requests.append(Request(_log_uniform(rng, MIN_PROMPT, longest), output_len))
    return requests


class Scheduler:
    """Continuous batching with chunked prefill, as vLLM V1 schedules tokens."""

    def __init__(self, workload: LongWorkload, requests: list[Request]) -> None:
        self.workload = workload
        self.waiting = list(requests)
        self.running: list[Request] = []
        self.free_blocks = workload.num_kv_blocks

    def _blocks(self, request: Request) -> int:
        total = request.prompt_len + request.output_len
        return math.ceil(total / self.workload.block_size)

    def step(self) -> StepShape:
        budget = self.workload.max_num_batched_tokens
        prompts: list[PromptChunk] = []
        decodes: list[int] = []
        for request in self.running:
            if budget == 0:
                break
            if request.prefilling:
                budget -= self._prefill(request, budget, prompts)
            else:
                seq_len = request.prompt_len + request.generated
                decodes.append(math.ceil(seq_len / self.workload.block_size))
                request.generated += 1
                budget -= 1
        while budget > 0 and self._admits():
            request = self.waiting.pop(0)
            self.free_blocks -= self._blocks(request)
            request.computed = self._cached(request)
            self.running.append(request)
            budget -= self._prefill(request, budget, prompts)
        self._finish()
        return StepShape(tuple(prompts), tuple(decodes))

    def _cached(self, request: Request) -> int:
        """Whole blocks of the extended prompt, once it has been computed."""
        earlier = request.extends
        if earlier is None or earlier.prefilling:
            return 0
        shared = min(earlier.prompt_len, request.prompt_len - 1)
        return shared // self.workload.block_size * self.workload.block_size

    def _admits(self) -> bool:
        return (
            bool(self.waiting)
            and len(self.running) < self.workload.max_num_seqs
            and self._blocks(self.waiting[0]) <= self.free_blocks
        )

    def _prefill(
        self, request: Request, budget: int, prompts: list[PromptChunk]
    ) -> int:
        """Schedule the next chunk; the step that ends the prompt samples a token."""
        tokens = min(request.prompt_len - request.computed, budget)
        prompts.append(PromptChunk(tokens, request.computed))
        request.computed += tokens
        if not request.prefilling:
            request.generated = 1
        return tokens

    def _finish(self) -> None:
        for request in [r for r in self.running if r.generated >= r.output_len]:
            self.running.remove(request)
            self.free_blocks += self._blocks(request)


def simulate(workload: LongWorkload) -> StepTrace:
    scheduler = Scheduler(workload, make_requests(workload))
    steps = []
    while scheduler.waiting or scheduler.running:
        steps.append(scheduler.step())
    return StepTrace(
        block_size=workload.block_size,
        max_num_seqs=workload.max_num_seqs,
        max_num_batched_tokens=workload.max_num_batched_tokens,
        max_model_len=workload.max_model_len,
        num_kv_blocks=workload.num_kv_blocks,
        steps=tuple(steps),
    )


# KV caches of 4096 blocks (512k tokens, an 8B model's on one Gaudi 2) hold four
# 128k sequences; 1M contexts need a larger one (16384 blocks, 2M tokens).
WORKLOADS = (
    LongWorkload("32k", 32768, 32, 4096, num_requests=200),
    LongWorkload("128k", 131072, 16, 4096, num_requests=80),
    LongWorkload("1M", 1048576, 4, 16384, num_requests=24),
)
