"""Async scheduling on generates exactly what it generates off, and overlaps.

One mixed batch (shared prefixes, chunked prompts, preemption under a small KV
budget, structured output, logprobs, n > 1, seeds, penalties, stop strings) runs
once with ``async_scheduling`` on and once off; every output must match. Then,
with the forward and the host's preparation each slowed by a known delay, a
decode step with async on must take less than the two together.
"""

import itertools
import statistics
import time
from typing import Any

import pytest
import torch
from models import model_path as model_dir

from e2e.harness import random_prompts, vllm_engine
from e2e.test_generate import counter, vocab_size

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
MAX_TOKENS = 24
MIN_TOKENS = 10


def mixed_requests() -> tuple[list[list[int]], list]:
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    size = vocab_size(MODEL)
    shared = random_prompts([48], size, seed=3)[0]
    prompts = [shared + t for t in random_prompts([2, 30, 150], size, seed=4)]
    prompts += random_prompts([1, 17, 90, 200, 40], size, seed=5)
    greedy = {"max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0.0}
    params = [
        SamplingParams(**greedy),
        SamplingParams(**greedy, logprobs=3, prompt_logprobs=2),
        SamplingParams(**{**greedy, "temperature": 1.0}, seed=11),
        SamplingParams(**{**greedy, "temperature": 0.8}, seed=12, n=2),
        SamplingParams(
            **greedy,
            presence_penalty=0.5,
            frequency_penalty=0.4,
            repetition_penalty=1.3,
        ),
        SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, stop=["e", "a"]),
        SamplingParams(
            max_tokens=8,
            temperature=0.0,
            structured_outputs=StructuredOutputsParams(choice=["yes", "no", "maybe"]),
        ),
        # All but 64 tokens stop the request, but not before MIN_TOKENS: where
        # the stop mask lifts must not move with async on.
        SamplingParams(
            max_tokens=MAX_TOKENS,
            temperature=0.0,
            min_tokens=MIN_TOKENS,
            stop_token_ids=list(range(64, size)),
        ),
    ]
    return prompts, params


def generate(async_scheduling: bool) -> tuple[list, float]:
    prompts, params = mixed_requests()
    with vllm_engine(
        model_dir(MODEL),
        block_size=16,
        max_model_len=352,
        num_gpu_blocks_override=24,
        kv_cache_memory_bytes=None,
        max_num_batched_tokens=64,
        enable_prefix_caching=True,
        async_scheduling=async_scheduling,
    ) as llm:
        results = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        metrics = {m.name: m for m in llm.get_metrics()}
    return results, counter(metrics, "vllm:num_preemptions")


def logprob_values(logprobs) -> torch.Tensor:
    return torch.tensor(
        [[entry[t].logprob for t in sorted(entry)] for entry in logprobs if entry]
    )


def test_async_scheduling_matches_sync_on_mixed_workload():
    on, preemptions_on = generate(True)
    off, preemptions_off = generate(False)
    assert preemptions_on > 0 and preemptions_off > 0
    for i, (a, b) in enumerate(zip(on, off, strict=True)):
        assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs], i
        assert [o.text for o in a.outputs] == [o.text for o in b.outputs], i
    with_logprobs = on[1], off[1]
    torch.testing.assert_close(
        *(logprob_values(r.outputs[0].logprobs) for r in with_logprobs)
    )
    torch.testing.assert_close(
        *(logprob_values(r.prompt_logprobs) for r in with_logprobs)
    )
    assert on[6].outputs[0].text in ("yes", "no", "maybe")
    # Stop tokens held back for MIN_TOKENS, then it ends on the first one.
    *kept, last = on[7].outputs[0].token_ids
    assert len(kept) >= MIN_TOKENS and last >= 64 and max(kept) < 64


# Injected per step: a forward pass sleeps on the device stream, the host's
# preparation of the step's passes sleeps on the host (sleeping frees the GIL,
# as torch's kernels do).
FORWARD_DELAY_S = 0.25
PREPARE_DELAY_S = 0.25


def slow_down(worker: Any) -> list[float]:
    """Delay the runner's forwards and preparation; return the list each step's
    start time is appended to."""
    runner = worker.model_runner
    forward, plan, execute = runner._forward, runner._plan_passes, runner.execute_model
    step_starts: list[float] = []

    def slow_forward(*args: Any) -> Any:
        time.sleep(FORWARD_DELAY_S)
        return forward(*args)

    def slow_plan(*args: Any) -> Any:
        time.sleep(PREPARE_DELAY_S)
        return plan(*args)

    def timed_execute(*args: Any) -> Any:
        step_starts.append(time.perf_counter())
        return execute(*args)

    runner._forward, runner._plan_passes = slow_forward, slow_plan
    runner.execute_model = timed_execute
    return step_starts


def test_async_scheduling_overlaps_forward_with_host_preparation():
    from vllm import SamplingParams

    prompt = random_prompts([8], vocab_size(MODEL), seed=6)[0]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    with vllm_engine(model_dir(MODEL), async_scheduling=True) as llm:
        (step_starts,) = llm.collective_rpc(slow_down)
        llm.generate([{"prompt_token_ids": prompt}], params)
    # Steps after the prompt's: one decode pass each.
    decode_steps = [b - a for a, b in itertools.pairwise(step_starts[1:])]
    per_step = statistics.median(decode_steps)
    assert max(FORWARD_DELAY_S, PREPARE_DELAY_S) <= per_step
    assert per_step < FORWARD_DELAY_S + PREPARE_DELAY_S
