"""Granite-4.0-H (Mamba2 layers) and Qwen3-Next (gated delta-net layers), each
beside attention, generate transformers' greedy tokens through the plugin's
state cache (design_hybrid steps 7 and 8).

One engine per model: prompts of 1 to 140 tokens cross Granite's 16-token and
the delta rule's 64-token scan chunks and, under a 48-token step budget, are
split mid-chunk (their states carried between passes); a one-token prompt's
first step is a decode row without a state; a 20-block pool, which one
max_model_len request fits but the batch does not, forces preemptions (a
resumed request starts its state again). Each state layer's own term is shown
to matter: transformers without it generates other tokens.
"""

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from models import HYBRID_MODELS, model_path

from e2e.harness import (
    EngineSpec,
    counted,
    counters,
    engine_spec,
    hf_greedy,
    random_prompts,
    uses_engines,
    vllm_greedy,
)
from e2e.test_generate import vocab_size

MAX_TOKENS = 24
LENGTHS = [1, 2, 7, 33, 61, 140]
PROMPT_SEED = 43
BLOCK_SIZE = 16
# Each request holds one block per state group (3) besides its attention
# blocks: vLLM's start-up check wants 16 + 3 for one max_model_len request; the
# six prompts with their tokens need 27 + 18.
NUM_BLOCKS = 20
SPECS = [
    engine_spec(
        name,
        name=f"{name}-preempting",
        block_size=BLOCK_SIZE,
        max_model_len=256,
        num_gpu_blocks_override=NUM_BLOCKS,
        kv_cache_memory_bytes=None,
        max_num_batched_tokens=48,
        enable_chunked_prefill=True,
    )
    for name in HYBRID_MODELS
]


def prompts(name: str) -> list[list[int]]:
    return random_prompts(LENGTHS, vocab_size(name), seed=PROMPT_SEED)


@functools.cache
def reference(name: str) -> list[list[int]]:
    return hf_greedy(model_path(name), prompts(name), MAX_TOKENS, torch.float32)


@uses_engines(*SPECS)
def test_hybrid_matches_hf_with_chunks_and_preemption(
    llm: Any, shared_engine: EngineSpec
):
    name = shared_engine.model
    cache_config = llm.llm_engine.vllm_config.cache_config
    assert cache_config.block_size == BLOCK_SIZE
    assert not cache_config.enable_prefix_caching
    before = counters(llm)
    actual = vllm_greedy(llm, prompts(name), MAX_TOKENS)
    after = counters(llm)
    assert counted(before, after, "vllm:num_preemptions") > 0
    for length, want, got in zip(LENGTHS, reference(name), actual, strict=True):
        assert got == want, f"{name}: the {length}-token prompt diverged"


# ---- Each state layer's term matters: transformers without it differs ----


def no_skip_term(model: torch.nn.Module) -> None:
    """Granite's Mamba2 layers without their D * x skip term."""
    for layer in model.model.layers:
        mamba = getattr(layer, "mamba", None)
        if mamba is not None:
            mamba.D.data.zero_()


def no_decay(model: torch.nn.Module) -> None:
    """Qwen3-Next's delta rule with g = 0 (exp(A_log) ~ 0): nothing decays."""
    for layer in model.model.layers:
        linear_attn = getattr(layer, "linear_attn", None)
        if linear_attn is not None:
            linear_attn.A_log.data.fill_(-30.0)


ABLATIONS: dict[str, Callable[[torch.nn.Module], None]] = {
    "tiny-granite-4.0-h": no_skip_term,
    "tiny-qwen3-next": no_decay,
}


@pytest.mark.parametrize("name", HYBRID_MODELS)
def test_hybrid_state_term_changes_the_tokens(name: str):
    ablated = hf_greedy(
        model_path(name),
        prompts(name),
        MAX_TOKENS,
        torch.float32,
        prepare=ABLATIONS[name],
    )
    assert ablated != reference(name)
