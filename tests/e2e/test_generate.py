"""Greedy generations through vLLM on the plugin equal transformers' token for token.

Float32, tiny local models; each case changes one thing the runner must get right:
block size, architecture, preemption, prefix caching, chunked prompts. Prompt
passes are merged (packed) by default; one case runs one row per prompt.
"""

import functools
import json
import os

import pytest
import torch
from conftest import MODELS_DIR
from models import model_path as model_dir

from e2e.harness import (
    DEFAULT_ENGINE,
    EngineSpec,
    counted,
    counters,
    engine_spec,
    hf_greedy,
    random_prompts,
    uses_engines,
    vllm_engine,
    vllm_greedy,
)

pytestmark = pytest.mark.slow

MAX_TOKENS = 32
# One token to several 16-token blocks, with exact multiples of the block size.
LENGTHS = [1, 5, 16, 33, 64, 100, 128, 129, 250]
# Mixture-of-experts models: Mixtral, Qwen2-MoE (gated shared expert), Qwen3-MoE,
# GLM-4-MoE (DeepSeek-V3 routing: sigmoid, bias, groups, scale, shared expert).
MOE_MODELS = ["tiny-mixtral", "tiny-qwen2-moe", "tiny-qwen3-moe", "tiny-glm4-moe"]
# DeepSeek-V2 layout: multi-head latent attention (MLA) on a latent KV cache, in
# the -moe variant routed experts beside a shared one, in -q192 DeepSeek's own
# head widths (192-wide queries and keys, 128-wide values).
MLA_MODELS = ["tiny-deepseek-v2", "tiny-deepseek-v2-moe", "tiny-deepseek-v2-q192"]
# The runner's hard cases run on one model of each attention and MLP kind.
HARD_CASE_MODELS = ["tiny-llama", *MOE_MODELS[:2], MLA_MODELS[1]]


def blocks_of_16(name: str) -> EngineSpec:
    """16-token blocks, prefix caching on (vLLM's default, stated): the engine
    of the plain, the other-architecture and the prefix-hit cases."""
    return engine_spec(name, block_size=16, enable_prefix_caching=True)


def chunked(name: str) -> EngineSpec:
    """A 64-token step budget: every longer prompt runs in chunks (the
    sampling tests share tiny-llama's engine)."""
    return engine_spec(
        name,
        name=f"{name}-chunked",
        block_size=16,
        max_model_len=512,
        max_num_batched_tokens=64,
        enable_chunked_prefill=True,
    )


def vocab_size(name: str) -> int:
    return json.loads((MODELS_DIR / name / "config.json").read_text())["vocab_size"]


@functools.cache
def reference(name: str, lengths: tuple[int, ...], seed: int) -> list[list[int]]:
    prompts = random_prompts(list(lengths), vocab_size(name), seed)
    return hf_greedy(model_dir(name), prompts, MAX_TOKENS, torch.float32)


def model_name(llm) -> str:
    return os.path.basename(llm.llm_engine.model_config.model)


def check_against_hf(llm, prompts_seed: int = 0, lengths=LENGTHS) -> dict:
    """Greedy tokens of ``llm`` equal transformers'; returns how much each of
    vLLM's counters grew meanwhile."""
    name = model_name(llm)
    prompts = random_prompts(lengths, vocab_size(name), prompts_seed)
    expected = reference(name, tuple(lengths), prompts_seed)
    before = counters(llm)
    actual = vllm_greedy(llm, prompts, MAX_TOKENS)
    after = counters(llm)
    for i, (want, got) in enumerate(zip(expected, actual, strict=True)):
        assert got == want, f"prompt {i} (length {lengths[i]}) diverged"
    return {metric: counted(before, after, metric) for metric in after}


def counter(metrics, name: str) -> float:
    return metrics[name].value if name in metrics else 0.0


# DeepSeek-V2's 128-token blocks run through vLLM's default engine (its core in
# a process of its own): the MLA path as a user takes it.
@uses_engines(
    *(
        engine_spec(
            name,
            name=f"{name}-b{block_size}",
            block_size=block_size,
            env=DEFAULT_ENGINE if name in MLA_MODELS else None,
        )
        if block_size != 16
        else blocks_of_16(name)
        for name in ["tiny-llama", MLA_MODELS[0]]
        for block_size in [16, 128]
    )
)
def test_generate_matches_hf_block_sizes(llm):
    check_against_hf(llm)


@uses_engines(
    *map(
        blocks_of_16,
        [
            "tiny-qwen2",
            "tiny-qwen3",
            "tiny-mistral",
            "tiny-opt",
            "tiny-gpt2",
            *MOE_MODELS,
            *MLA_MODELS[1:],
        ],
    )
)
def test_generate_matches_hf_other_architectures(llm):
    check_against_hf(llm)


# 24 blocks of 16 tokens cannot hold the batch at once: requests get preempted
# and recomputed, and must still continue exactly as transformers does.
@uses_engines(
    *(
        engine_spec(
            name,
            name=f"{name}-preempted",
            block_size=16,
            max_model_len=352,
            num_gpu_blocks_override=24,
            kv_cache_memory_bytes=None,
        )
        for name in HARD_CASE_MODELS
    )
)
def test_generate_matches_hf_with_preemption(llm):
    assert check_against_hf(llm).get("vllm:num_preemptions", 0) > 0


@uses_engines(*map(chunked, HARD_CASE_MODELS))
def test_generate_matches_hf_with_chunked_prompts(llm):
    check_against_hf(llm)


@uses_engines(
    engine_spec(
        "tiny-llama",
        name="tiny-llama-one-row",
        env={"VLLM_HPU_MERGED_PREFILL": "false"},
        block_size=16,
        max_num_batched_tokens=64,
        enable_chunked_prefill=True,
    )
)
def test_generate_matches_hf_with_one_row_per_prompt(llm):
    """VLLM_HPU_MERGED_PREFILL=false (the cases above run merged prefill, the
    default): padded rows per prompt, chunked prompts with cached context."""
    check_against_hf(llm)


@uses_engines(*map(blocks_of_16, HARD_CASE_MODELS))
def test_generate_matches_hf_with_prefix_cache_hits(llm):
    name = model_name(llm)
    shared = random_prompts([200], vocab_size(name), seed=7)[0]
    tails = random_prompts([1, 9, 40], vocab_size(name), seed=8)
    prompts = [shared + tail for tail in tails]
    expected = hf_greedy(model_dir(name), prompts, MAX_TOKENS, torch.float32)
    before = counters(llm)
    first = vllm_greedy(llm, prompts[:1], MAX_TOKENS)
    rest = vllm_greedy(llm, prompts[1:], MAX_TOKENS)
    assert first + rest == expected
    assert counted(before, counters(llm), "vllm:prefix_cache_hits") > 0


@pytest.mark.smoke
@uses_engines(blocks_of_16("tiny-llama"))
def test_generate_matches_hf_with_prefix_hits_inside_one_step(llm):
    """Prompts with one prefix arriving together: vLLM hands the later ones the
    earlier one's blocks as cached context in the same step, and the runner runs
    them in separate passes (short tails and a long one), writer first."""
    name = model_name(llm)
    shared = random_prompts([48], vocab_size(name), seed=3)[0]
    tails = random_prompts([3, 20, 200], vocab_size(name), seed=2)
    prompts = [shared + tail for tail in tails]
    expected = hf_greedy(model_dir(name), prompts, MAX_TOKENS, torch.float32)
    before = counters(llm)
    assert vllm_greedy(llm, prompts, MAX_TOKENS) == expected
    assert counted(before, counters(llm), "vllm:prefix_cache_hits") > 0


def test_generate_matches_hf_smollm2():
    """The real model, in float32: its bf16 weights upcast the same way on both
    sides, so greedy tokens must agree exactly (bf16 compute would differ from
    transformers' only by accumulation order, which a random-weight model cannot
    tell from a bug)."""
    from transformers import AutoTokenizer

    path = model_dir("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(path)
    texts = [
        "The capital of France is",
        "Write a short poem about the sea.\n" * 12,
        "def fibonacci(n):",
        "Once upon a time, " * 40,
    ]
    prompts = [tokenizer(text)["input_ids"] for text in texts]
    expected = hf_greedy(path, prompts, MAX_TOKENS, torch.float32)
    with vllm_engine(path, max_model_len=512) as llm:
        actual = vllm_greedy(llm, prompts, MAX_TOKENS)
        # No --block-size given: the platform's 128 must survive model loading.
        assert llm.llm_engine.vllm_config.cache_config.block_size == 128
    assert actual == expected
    assert tokenizer.decode(actual[0]).startswith(" Paris")
