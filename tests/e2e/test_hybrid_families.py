"""Granite-4.0-H (Mamba2 layers) and Qwen3-Next (gated delta-net layers), each
beside attention, generate transformers' greedy tokens through the plugin's
state cache (design_hybrid steps 7 and 8).

One engine per model (Granite's compiled: nothing compiles after warmup):
prompts of 1 to 140 tokens cross Granite's 16-token and the delta rule's
64-token scan chunks and, under a 48-token step budget, are
split mid-chunk (their states carried between passes); a one-token prompt's
first step is a decode row without a state; a 23-block pool, which one
max_model_len request fits but the batch does not, forces preemptions. Prefix
caching is on (vLLM's default; Mamba cache mode "align"): prompts are split at
block boundaries, states are saved there, and a resumed request or one sharing
a cached prefix restores its state from the hit's block. Each state layer's own
term is shown to matter: transformers without it generates other tokens.
"""

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from models import HYBRID_MODELS, model_path

from e2e.harness import (
    DEFAULT_ENGINE,
    EngineSpec,
    compiled_graphs,
    counted,
    counters,
    engine_spec,
    hf_greedy,
    one_bucket,
    random_prompts,
    uses_engines,
    vllm_greedy,
)
from e2e.test_generate import vocab_size

MAX_TOKENS = 24
LENGTHS = [1, 2, 7, 33, 61, 140]
PROMPT_SEED = 43
BLOCK_SIZE = 16
# Each request holds up to two blocks per state group (3) besides its attention
# blocks: vLLM's start-up check wants 16 + 6 (and the null block) for one
# max_model_len request; the six prompts with their tokens need 27 + 36.
NUM_BLOCKS = 23
# Granite's engine runs compiled emulation (dynamo's eager backend): the state
# layers' passes keep the buckets' static shapes, so warmup leaves nothing to
# compile. Qwen3-Next compiled passes both tests too (COMPILED set to it: no
# graph after warmup), but its warmup took 204 s against Granite's 74 s on a
# loaded 2-core machine, so its engine stays eager here.
COMPILED = "tiny-granite-4.0-h"
# One bucket per kind of pass, as a compiled test warms up only what it runs:
# prompt chunks of up to 48 tokens with no context or up to 16 blocks of it,
# decodes of up to 8 rows over the cache's 23 blocks.
COMPILED_ENV = {
    "VLLM_HPU_COMPILE_BACKEND": "eager",
    **one_bucket("PROMPT_SEQ", 48),
    **one_bucket("PROMPT_BLOCK", 16),
    **one_bucket("DECODE_BS", 8),
    **one_bucket("DECODE_BLOCK", NUM_BLOCKS),
}
SPECS = [
    engine_spec(
        name,
        name=f"{name}-preempting" + ("-compiled" if name == COMPILED else ""),
        # The eager one through vLLM's default engine (its core in its own
        # process); the compiled one in-process, where its graphs are counted.
        env=COMPILED_ENV if name == COMPILED else DEFAULT_ENGINE,
        enforce_eager=name != COMPILED,
        block_size=BLOCK_SIZE,
        max_model_len=256,
        num_gpu_blocks_override=NUM_BLOCKS,
        kv_cache_memory_bytes=None,
        max_num_batched_tokens=48,
        enable_chunked_prefill=True,
        # Every block's state stays cached (vLLM's default keeps only each
        # prompt's last boundary): decode's checkpoints are hit too.
        prefix_cache_retention_interval=None,
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
    assert cache_config.mamba_cache_mode == "align"
    before, warmed = counters(llm), compiled_graphs()
    actual = vllm_greedy(llm, prompts(name), MAX_TOKENS)
    after = counters(llm)
    assert counted(before, after, "vllm:num_preemptions") > 0
    if name == COMPILED:
        assert warmed > 0 and compiled_graphs() == warmed
    for length, want, got in zip(LENGTHS, reference(name), actual, strict=True):
        assert got == want, f"{name}: the {length}-token prompt diverged"


# A 40-token prompt runs as chunks [0, 32) and [32, 40) (vLLM's align split),
# then decodes past 48: its state after 32 tokens, saved by a prefill chunk,
# and after 48, saved by a decode step, are cached with their blocks. Each
# follower runs alone right after the request it shares a prefix with, so no
# other allocation evicts those blocks first.
SHARED_LENGTH = 40


@uses_engines(*SPECS)
def test_hybrid_resumes_from_cached_states(llm: Any, shared_engine: EngineSpec):
    name = shared_engine.model
    base, tail = random_prompts([SHARED_LENGTH, 8], vocab_size(name), seed=44)
    prompts: list[list[int]] = []
    outputs: list[list[int]] = []
    hits = []
    for shared in (0, 35, 50):  # a prefix of the last request and its tokens
        prompt = (prompts[-1] + outputs[-1])[:shared] + tail if shared else base
        before = counters(llm)
        outputs += vllm_greedy(llm, [prompt], MAX_TOKENS)
        hits.append(counted(before, counters(llm), "vllm:prefix_cache_hits"))
        prompts.append(prompt)
    assert hits == [0, 32, 48]
    assert outputs == hf_greedy(model_path(name), prompts, MAX_TOKENS, torch.float32)


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
