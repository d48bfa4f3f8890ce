"""VLLM_HPU_BUCKET_TRACE: the runner records every served step's real shape."""

import pytest
from models import model_path as model_dir

from e2e.harness import random_prompts, vllm_engine, vllm_greedy
from vllm_hpu.bucketing.trace import PromptChunk, StepTrace

pytestmark = pytest.mark.slow


def test_runner_records_the_steps_it_serves(hpu_env, tmp_path):
    path = tmp_path / "steps.jsonl"
    hpu_env(VLLM_HPU_BUCKET_TRACE=str(path))
    prompts = random_prompts([20, 40, 70], 1024, seed=1)
    engine = dict(block_size=16, max_model_len=256, max_num_seqs=4)
    with vllm_engine(model_dir("tiny-llama"), enforce_eager=True, **engine) as llm:
        vllm_greedy(llm, prompts, 3)
    trace = StepTrace.load(path)
    assert (trace.block_size, trace.max_num_seqs, trace.max_model_len) == (16, 4, 256)
    first, *rest = trace.steps
    assert sorted(first.prompts) == [PromptChunk(n, 0) for n in (20, 40, 70)]
    # Two more tokens each: the KV of the token decoded is written that step.
    assert [s.decode_blocks for s in rest] == [(2, 3, 5), (2, 3, 5)]
