"""DeepSeek-V3.2's sparse attention generates transformers' greedy tokens, and
its indexer changes them.

tiny-deepseek-v32 (scripts/tiny_deepseek.py): each layer's indexer keeps a
query's 16 best keys, far fewer than the prompts' 33 to 188 tokens. One engine,
through vLLM's default path (its core in a process of its own), compiled
(dynamo's eager backend: nothing compiles after warmup), runs prompts
of mixed lengths split into chunks by a 48-token step budget, preempted by a
20-block cache, and a prefix-cache hit: the indexer's keys of cached context
come from their own cache. transformers with every key kept (an ``index_topk``
above the prompts) generates other tokens.
"""

import functools
import json

import torch
from conftest import MODELS_DIR
from models import model_path

from e2e.harness import (
    DEFAULT_ENGINE,
    SENDS_CALLABLES,
    core_in_own_process,
    counted,
    counters,
    engine_spec,
    one_bucket,
    uses_engines,
    vllm_greedy,
    workers_compiled_graphs,
)
from e2e.references import cached_tokens
from e2e.test_families import greedy_tokens, prompt_batches

MODEL = "tiny-deepseek-v32"
INDEX_TOPK = json.loads((MODELS_DIR / MODEL / "config.json").read_text())["index_topk"]
NUM_BLOCKS = 20
SPARSE = engine_spec(
    MODEL,
    name=f"{MODEL}-preempting-compiled",
    env={
        **DEFAULT_ENGINE,
        **SENDS_CALLABLES,  # compiled_graphs read in the engine's process
        "VLLM_HPU_COMPILE_BACKEND": "eager",
        **one_bucket("PROMPT_SEQ", 48),
        **one_bucket("PROMPT_BLOCK", 16),
        **one_bucket("DECODE_BS", 8),
        **one_bucket("DECODE_BLOCK", NUM_BLOCKS),
    },
    enforce_eager=False,
    block_size=16,
    max_model_len=256,
    num_gpu_blocks_override=NUM_BLOCKS,
    kv_cache_memory_bytes=None,
    max_num_batched_tokens=48,
    enable_chunked_prefill=True,
    enable_prefix_caching=True,
)


def _v32_greedy(model_dir: str, prompts: list[list[int]], index_topk: int) -> list:
    """transformers' DeepSeek-V3.2 by its own class: vLLM, once imported, maps
    the model type to DeepSeek-V3's config for AutoModel (no indexer)."""
    from transformers import DeepseekV32ForCausalLM

    model = DeepseekV32ForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, index_topk=index_topk
    ).eval()
    return greedy_tokens(model, prompts)


@functools.cache
def reference(index_topk: int) -> list[list[int]]:
    first, second = prompt_batches(MODEL)
    return cached_tokens(
        _v32_greedy, model_path(MODEL), prompts=first + second, index_topk=index_topk
    )


@uses_engines(SPARSE)
def test_sparse_attention_matches_hf_with_chunks_prefix_hits_and_preemption(llm):
    first, second = prompt_batches(MODEL)
    assert min(len(p) for p in first[1:] + second) > 2 * INDEX_TOPK
    expected = reference(INDEX_TOPK)
    assert core_in_own_process(llm)
    before, (warmed,) = counters(llm), workers_compiled_graphs(llm)
    actual = vllm_greedy(llm, first, 24) + vllm_greedy(llm, second, 24)
    after = counters(llm)
    assert counted(before, after, "vllm:num_preemptions") > 0
    assert counted(before, after, "vllm:prefix_cache_hits") > 0
    assert warmed > 0 and workers_compiled_graphs(llm) == [warmed]
    for i, (want, got) in enumerate(zip(expected, actual, strict=True)):
        assert got == want, f"prompt {i} diverged"


def test_sparse_attention_changes_the_tokens():
    """Every key kept, transformers generates other tokens on the long prompts."""
    dense = reference(1 << 20)
    assert dense[2:4] != reference(INDEX_TOPK)[2:4]
