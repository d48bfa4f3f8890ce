"""Sampling through vLLM's sampler on the plugin: logprobs, seeds, bad requests."""

import math

import pytest
import torch
from models import model_path
from transformers import AutoModelForCausalLM
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

from e2e.harness import random_prompts, uses_engines
from e2e.test_generate import chunked

MODEL = "tiny-llama"
VOCAB_SIZE = 1024

# Chunked prompts (budget 64) exercise discarded samples of partial prefills;
# the engine is test_generate's chunked-prompt one.
pytestmark = [pytest.mark.slow, pytest.mark.smoke, uses_engines(chunked(MODEL))]


@torch.no_grad()
def hf_log_softmax(token_ids: list[int]) -> torch.Tensor:
    """[len - 1, vocab] log-probabilities of each next token, by transformers."""
    model = AutoModelForCausalLM.from_pretrained(model_path(MODEL), dtype=torch.float32)
    logits = model(input_ids=torch.tensor([token_ids])).logits[0, :-1]
    return logits.log_softmax(dim=-1)


def test_sampling_logprobs_match_transformers(llm):
    prompt = random_prompts([40], VOCAB_SIZE, seed=3)[0]
    params = SamplingParams(
        temperature=0.0, max_tokens=8, logprobs=5, prompt_logprobs=3, ignore_eos=True
    )
    (result,) = llm.generate([{"prompt_token_ids": prompt}], params)
    output = result.outputs[0]
    reference = hf_log_softmax(prompt + list(output.token_ids))
    for step, (token, top) in enumerate(
        zip(output.token_ids, output.logprobs, strict=True)
    ):
        expected = reference[len(prompt) - 1 + step]
        assert math.isclose(top[token].logprob, expected[token].item(), abs_tol=1e-4)
        assert len(top) >= 5
        for candidate, logprob in top.items():
            assert math.isclose(
                logprob.logprob, expected[candidate].item(), abs_tol=1e-4
            )
    # Prompt logprobs: position p scores prompt token p (the first has none).
    assert result.prompt_logprobs[0] is None
    for position in range(1, len(prompt)):
        scored = result.prompt_logprobs[position]
        token = prompt[position]
        want = reference[position - 1][token].item()
        assert math.isclose(scored[token].logprob, want, abs_tol=1e-4), position


def test_sampling_seeded_is_reproducible_and_batch_independent(llm):
    prompts = random_prompts([3, 90, 150, 20], VOCAB_SIZE, seed=5)
    seeded = SamplingParams(
        temperature=1.0, top_p=0.9, top_k=50, seed=1234, max_tokens=16
    )
    other = SamplingParams(temperature=0.8, max_tokens=16)
    alone = llm.generate([{"prompt_token_ids": prompts[1]}], seeded)
    again = llm.generate([{"prompt_token_ids": prompts[1]}], seeded)
    in_batch = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], [other, seeded, other, other]
    )
    tokens = alone[0].outputs[0].token_ids
    assert again[0].outputs[0].token_ids == tokens
    assert in_batch[1].outputs[0].token_ids == tokens


def test_sampling_logit_bias_and_penalties_are_applied(llm):
    prompt = random_prompts([12], VOCAB_SIZE, seed=9)[0]
    biased = SamplingParams(
        temperature=0.0, max_tokens=12, ignore_eos=True, logit_bias={7: 20.0}
    )
    penalized = SamplingParams(
        temperature=0.0,
        max_tokens=12,
        ignore_eos=True,
        logit_bias={7: 20.0},
        frequency_penalty=2.0,
    )
    plain, repeated = llm.generate(
        [{"prompt_token_ids": prompt}] * 2, [biased, penalized]
    )
    assert set(plain.outputs[0].token_ids) == {7}
    # Each emitted 7 costs 2.0 more, so the bias stops winning after a few steps.
    ids = repeated.outputs[0].token_ids
    assert ids[0] == 7
    assert ids.count(7) < len(ids)


def test_sampling_too_long_prompt_is_rejected_and_engine_keeps_serving(llm):
    too_long = random_prompts([600], VOCAB_SIZE, seed=11)[0]
    with pytest.raises(VLLMValidationError, match="maximum context length is 512"):
        llm.generate([{"prompt_token_ids": too_long}], SamplingParams(max_tokens=4))
    fine = random_prompts([10], VOCAB_SIZE, seed=12)[0]
    (result,) = llm.generate([{"prompt_token_ids": fine}], SamplingParams(max_tokens=4))
    assert len(result.outputs[0].token_ids) == 4
