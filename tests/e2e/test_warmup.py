"""After warmup, serving inside the bucket ranges compiles nothing.

Compiled emulation (torch.compile, dynamo's ``eager`` backend) on tiny-llama with a
small bucket set; compilations are read from torch's own counters.
"""

import json

import pytest
import torch
from models import model_path as model_dir

from e2e.harness import (
    compiled_graphs,
    hf_greedy,
    random_prompts,
    vllm_engine,
    vllm_greedy,
)

pytestmark = pytest.mark.slow

MAX_TOKENS = 8
SMALL_BUCKETS = {
    "VLLM_PROMPT_SEQ_BUCKET_MIN": "32",
    "VLLM_PROMPT_SEQ_BUCKET_STEP": "32",
    "VLLM_PROMPT_SEQ_BUCKET_MAX": "96",
    "VLLM_PROMPT_BLOCK_BUCKET_MAX": "4",
}
ENGINE = dict(
    block_size=16,
    max_model_len=128,
    max_num_seqs=2,
    max_num_batched_tokens=192,
    enable_prefix_caching=True,
)


def serve(llm, prompts):
    """Greedy tokens and the number of graphs torch compiled meanwhile."""
    before = compiled_graphs()
    tokens = vllm_greedy(llm, prompts, MAX_TOKENS)
    return tokens, compiled_graphs() - before


def greedy(name: str, prompts: list[list[int]]) -> list[list[int]]:
    """Transformers' greedy tokens (cached on disk)."""
    return hf_greedy(model_dir(name), prompts, MAX_TOKENS, torch.float32)


def workload() -> list[list[list[int]]]:
    """Batches inside the ranges: short and long prompts, then prefix-cache hits."""
    shared = random_prompts([48], 1024, seed=3)[0]
    return [
        random_prompts([5, 31, 60, 90], 1024, seed=1),
        [shared + tail for tail in random_prompts([3, 20], 1024, seed=2)],
        [shared + tail for tail in random_prompts([7, 30], 1024, seed=4)],
    ]


# MoE routing and experts keep static shapes too: they warm up and replay
# alike, and equal transformers as eager engines do (test_generate). MLA
# layers on the latent cache (tiny DeepSeek-V2-MoE) are checked the same way,
# compiled, with prompt chunks reading cached context, by test_data_parallel's
# offline and tensor-parallel runs.
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mixtral"])
def test_warmup_leaves_nothing_to_compile_and_equals_transformers(
    name, hpu_env, vllm_log
):
    hpu_env(**SMALL_BUCKETS, VLLM_HPU_COMPILE_BACKEND="eager")
    expected_batches = [greedy(name, batch) for batch in workload()]
    beyond = random_prompts([110, 110], 1024, 5)
    beyond_expected = greedy(name, beyond)
    before_warmup = compiled_graphs()
    with vllm_engine(model_dir(name), enforce_eager=False, **ENGINE) as llm:
        assert compiled_graphs() > before_warmup
        for batch, expected in zip(workload(), expected_batches, strict=True):
            tokens, compiled = serve(llm, batch)
            assert compiled == 0
            assert tokens == expected
        # 110-token prompts are beyond the 96-token prompt range: they run on a
        # bucket rounded past the range, compiled once, with one warning.
        tokens, compiled = serve(llm, beyond[:1])
        assert tokens == beyond_expected[:1]
        assert compiled > 0
        tokens, compiled = serve(llm, beyond[1:])
        assert tokens == beyond_expected[1:]
        assert compiled == 0
    logs = vllm_log.messages()
    warnings = [m for m in logs if m.endswith("was not warmed-up!")]
    assert warnings == ["Configuration: (prompt, 1, 128, 0) was not warmed-up!"]
    steps = [m for m in logs if m.startswith("[Warmup][")]
    assert steps[0].startswith("[Warmup][Prompt][1/")
    assert any(m.startswith("[Warmup][Prompt]") and "ctx_blocks:" in m for m in steps)
    assert any(m.startswith("[Warmup][Decode]") for m in steps)
    assert any(m.startswith("[Warmup][Graph/Decode]") for m in steps)
    assert any(m.startswith("Graph/Prompt captured:") for m in logs)
    assert any(m.startswith("Warmup finished in ") for m in logs)


def test_inductor_compiled_emulation_equals_transformers(hpu_env):
    """Inductor lowers the layers as vLLM defines them: only an eager run gets the
    oneDNN-packed linear weights, which inductor cannot take as graph inputs."""
    prompts = random_prompts([5, 31], 1024, seed=1)
    hpu_env(**SMALL_BUCKETS, VLLM_HPU_COMPILE_BACKEND="inductor", VLLM_SKIP_WARMUP="1")
    with vllm_engine(model_dir("tiny-llama"), enforce_eager=False, **ENGINE) as llm:
        tokens, compiled = serve(llm, prompts)
    assert compiled > 0
    assert tokens == greedy("tiny-llama", prompts)


def test_profiler_writes_a_chrome_trace(hpu_env, tmp_path, vllm_log):
    """An eager engine (no graphs to warm up: no warmup either) traced."""
    hpu_env(VLLM_PROFILER_ENABLED="1", VLLM_HPU_PROFILE_DIR=str(tmp_path))
    with vllm_engine(model_dir("tiny-llama"), enforce_eager=True, **ENGINE) as llm:
        vllm_greedy(llm, random_prompts([5, 40], 1024), MAX_TOKENS)
    assert not any("[Warmup]" in m for m in vllm_log.messages())
    (trace_file,) = tmp_path.glob("trace_rank0_*.json")
    events = json.loads(trace_file.read_text())["traceEvents"]
    names = {event["name"] for event in events}
    assert names == {"prepare", "forward", "sample"}
    assert all(event["ph"] == "X" and event["dur"] >= 0 for event in events)
    assert torch.tensor([e["ts"] for e in events]).diff().min() >= -1e6


def test_compact_default_buckets_leave_nothing_to_compile(hpu_env, vllm_log):
    """The default (compact) buckets, no range variables: warmup covers the
    workload's passes, prompt chunks with cached context included."""
    hpu_env(VLLM_HPU_COMPILE_BACKEND="eager")
    before_warmup = compiled_graphs()
    with vllm_engine(model_dir("tiny-llama"), enforce_eager=False, **ENGINE) as llm:
        assert compiled_graphs() > before_warmup
        for batch in workload():
            _, compiled = serve(llm, batch)
            assert compiled == 0
    logs = vllm_log.messages()
    assert any(m.startswith("Generated ") and "prompt buckets" in m for m in logs)
    assert not [m for m in logs if m.endswith("was not warmed-up!")]
