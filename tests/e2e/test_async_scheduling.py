"""Async scheduling on generates exactly what it generates off, and overlaps.

One mixed batch (shared prefixes, chunked prompts, preemption under a small KV
budget, structured output, logprobs, n > 1, seeds, penalties, stop strings) runs
once with ``async_scheduling`` on and once off; every output must match. Then,
with real work added to each forward (torch matmuls) and to the host's
preparation (a Python loop), a decode step with async on must take less than
the two together.
"""

import itertools
import statistics
import time
from typing import Any

import pytest
import torch
from models import model_path as model_dir

from e2e.harness import default_engine, random_prompts, vllm_engine
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
    # On, as vLLM's default engine runs it (its core in a process of its own).
    engine = default_engine if async_scheduling else vllm_engine
    with engine(
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


# Injected per step, real work: each forward pass multiplies matrices (torch
# frees the GIL in its kernels, as in a model's), the host's preparation of the
# step's passes runs a Python loop (holding the GIL, as vLLM's scheduler and
# the runner's input building do). Sleeps would free the GIL on both sides.
FORWARD_MATMULS = 6
MATRIX_SIZE = 768
HOST_LOOP = 1_500_000


def add_real_work(worker: Any) -> tuple[list[float], dict[str, list[float]]]:
    """Add the work to the runner's forwards and preparation; return the lists
    each step's start time and each piece of work's duration are appended to."""
    runner = worker.model_runner
    forward, plan, execute = runner._forward, runner._plan_passes, runner.execute_model
    step_starts: list[float] = []
    spent: dict[str, list[float]] = {"forward": [], "prepare": []}
    matrix = torch.randn(MATRIX_SIZE, MATRIX_SIZE)

    def busy_forward(*args: Any) -> Any:
        started = time.perf_counter()
        for _ in range(FORWARD_MATMULS):
            matrix @ matrix
        spent["forward"].append(time.perf_counter() - started)
        return forward(*args)

    def busy_plan(*args: Any) -> Any:
        started = time.perf_counter()
        sum(i * i for i in range(HOST_LOOP))
        spent["prepare"].append(time.perf_counter() - started)
        return plan(*args)

    def timed_execute(*args: Any) -> Any:
        step_starts.append(time.perf_counter())
        return execute(*args)

    runner._forward, runner._plan_passes = busy_forward, busy_plan
    runner.execute_model = timed_execute
    return step_starts, spent


def test_async_scheduling_overlaps_device_work_with_host_work():
    """A decode step takes about the longer of the two, not their sum, measured
    against the time each took in this run (so a busy machine slows both)."""
    from vllm import SamplingParams

    prompt = random_prompts([8], vocab_size(MODEL), seed=6)[0]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    with vllm_engine(model_dir(MODEL), async_scheduling=True) as llm:
        ((step_starts, spent),) = llm.collective_rpc(add_real_work)
        llm.generate([{"prompt_token_ids": prompt}], params)
    # Steps after the prompt's: one decode pass each.
    per_step = statistics.median(b - a for a, b in itertools.pairwise(step_starts[1:]))
    forward, prepare = (statistics.median(spent[k]) for k in ("forward", "prepare"))
    assert 0.9 * max(forward, prepare) <= per_step
    assert per_step < 0.85 * (forward + prepare), (per_step, forward, prepare)
