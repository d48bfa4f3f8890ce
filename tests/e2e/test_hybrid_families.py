"""Granite-4.0-H (Mamba2 layers and attention) generates transformers' greedy
tokens through the plugin's state cache (design_hybrid step 7).

One engine: prompts of 1 to 140 tokens cross the 16-token scan chunks and, under
a 48-token step budget, are split mid-chunk (their states carried between
passes); a one-token prompt's first step is a decode row without a state; a
20-block pool, which the longest request fits but the batch does not, forces
preemptions (a resumed request starts its state again). The state's skip term
(D) is shown to matter: transformers without it generates other tokens.
"""

import functools
from typing import Any

import torch
from models import model_path

from e2e.harness import (
    counted,
    counters,
    engine_spec,
    hf_greedy,
    random_prompts,
    uses_engines,
    vllm_greedy,
)
from e2e.test_generate import vocab_size

GRANITE = "tiny-granite-4.0-h"
MAX_TOKENS = 24
LENGTHS = [1, 2, 7, 33, 61, 140]
PROMPT_SEED = 43
BLOCK_SIZE = 16
# Each request holds one block per state group (3) besides its attention
# blocks: vLLM's start-up check wants 16 + 3 for one max_model_len request; the
# six prompts with their tokens need 27 + 18.
NUM_BLOCKS = 20
GRANITE_PREEMPTING = engine_spec(
    GRANITE,
    name=f"{GRANITE}-preempting",
    block_size=BLOCK_SIZE,
    max_model_len=256,
    num_gpu_blocks_override=NUM_BLOCKS,
    kv_cache_memory_bytes=None,
    max_num_batched_tokens=48,
    enable_chunked_prefill=True,
)


def prompts() -> list[list[int]]:
    return random_prompts(LENGTHS, vocab_size(GRANITE), seed=PROMPT_SEED)


@functools.cache
def reference() -> list[list[int]]:
    return hf_greedy(model_path(GRANITE), prompts(), MAX_TOKENS, torch.float32)


@uses_engines(GRANITE_PREEMPTING)
def test_granite4_h_matches_hf_with_chunks_and_preemption(llm: Any):
    cache_config = llm.llm_engine.vllm_config.cache_config
    assert cache_config.block_size == BLOCK_SIZE
    assert not cache_config.enable_prefix_caching
    before = counters(llm)
    actual = vllm_greedy(llm, prompts(), MAX_TOKENS)
    after = counters(llm)
    assert counted(before, after, "vllm:num_preemptions") > 0
    for length, want, got in zip(LENGTHS, reference(), actual, strict=True):
        assert got == want, f"the {length}-token prompt diverged"


def no_skip_term(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        mamba = getattr(layer, "mamba", None)
        if mamba is not None:
            mamba.D.data.zero_()


def test_granite4_h_skip_term_changes_the_tokens():
    ablated = hf_greedy(
        model_path(GRANITE), prompts(), MAX_TOKENS, torch.float32, prepare=no_skip_term
    )
    assert ablated != reference()
