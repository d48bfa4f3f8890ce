"""Async scheduling on generates exactly what it generates off.

One mixed batch (shared prefixes, chunked prompts, preemption under a small KV
budget, structured output, logprobs, n > 1, seeds, penalties, stop strings) runs
once with ``async_scheduling`` on and once off; every output must match.
"""

import pytest
import torch
from models import model_path as model_dir

from e2e.harness import random_prompts, vllm_engine
from e2e.test_generate import counter, vocab_size

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
MAX_TOKENS = 24


def mixed_requests() -> tuple[list[list[int]], list]:
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    size = vocab_size(MODEL)
    shared = random_prompts([48], size, seed=3)[0]
    prompts = [shared + t for t in random_prompts([2, 30, 150], size, seed=4)]
    prompts += random_prompts([1, 17, 90, 200], size, seed=5)
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
