"""gpt-oss and Llama 4 (text) generate transformers' greedy tokens, and each of
their features changes those tokens.

gpt-oss: attention sinks, a sliding window on every other layer, biased experts
with the clamped SwiGLU. Llama 4: chunked local attention, a NoPE layer with
attention temperature tuning, top-1 experts weighted on their input, a shared
expert. One engine per model serves every check: prompts of mixed lengths that
cross the 40-token windows and chunks, split into chunks by a 48-token step
budget, preempted by a 20-block cache, and a prefix-cache hit. Each feature is
shown to matter: transformers with it turned off generates other tokens.
"""

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from models import FAMILY_MODELS, model_path

from e2e.harness import (
    DEFAULT_ENGINE,
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
LENGTHS = [7, 33, 61, 140]
SHARED_PREFIX = 48
TAILS = [9, 30]
PROMPT_SEED = 41
# 20 blocks of 16 for 6 prompts of up to 164 tokens: preemption is certain.
# Without vLLM's hybrid KV cache manager, gpt-oss's windowed layers keep every
# block, as where the runner cannot run KV cache groups (speculative decoding,
# KV connectors): this keeps that route tested (test_window_blocks tests the
# groups).
SPECS = [
    engine_spec(
        name,
        name=f"{name}-preempting",
        env=DEFAULT_ENGINE,  # vLLM's default engine: its core in its own process
        block_size=16,
        max_model_len=256,
        num_gpu_blocks_override=20,
        disable_hybrid_kv_cache_manager=True,
        kv_cache_memory_bytes=None,
        max_num_batched_tokens=48,
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
    )
    for name in FAMILY_MODELS
]


def prompt_batches(name: str) -> tuple[list[list[int]], list[list[int]]]:
    """(mixed lengths and a shared prefix, the prefix again): the second batch
    hits the blocks the first leaves in the prefix cache."""
    vocab = vocab_size(name)
    mixed = random_prompts(LENGTHS, vocab, seed=PROMPT_SEED)
    shared = random_prompts([SHARED_PREFIX], vocab, seed=PROMPT_SEED + 1)[0]
    tails = random_prompts(TAILS, vocab, seed=PROMPT_SEED + 2)
    return [*mixed, shared + tails[0]], [shared + tails[1]]


@functools.cache
def reference(name: str) -> list[list[int]]:
    """transformers' tokens for both batches (once per model: the engine test and
    every ablation of the model compare with them)."""
    first, second = prompt_batches(name)
    return hf_greedy(model_path(name), first + second, MAX_TOKENS, torch.float32)


@uses_engines(*SPECS)
def test_family_matches_hf_with_chunks_prefix_hits_and_preemption(
    llm: Any, shared_engine: EngineSpec
):
    name = shared_engine.model
    first, second = prompt_batches(name)
    expected = reference(name)
    before = counters(llm)
    actual = vllm_greedy(llm, first, MAX_TOKENS)
    actual += vllm_greedy(llm, second, MAX_TOKENS)
    after = counters(llm)
    assert counted(before, after, "vllm:num_preemptions") > 0
    assert counted(before, after, "vllm:prefix_cache_hits") > 0
    for i, (want, got) in enumerate(zip(expected, actual, strict=True)):
        assert got == want, f"{name}: prompt {i} diverged"


# ---- Each feature matters: transformers without it generates other tokens ----


def no_sinks(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        layer.self_attn.sinks.data.fill_(-torch.inf)


def no_expert_biases(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        layer.mlp.experts.gate_up_proj_bias.data.zero_()
        layer.mlp.experts.down_proj_bias.data.zero_()


def no_shared_expert(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        shared = getattr(layer.feed_forward, "shared_expert", None)
        if shared is not None:
            shared.down_proj.weight.data.zero_()


def routing_weights_on_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama 4's MoE with the routing weight scaling the expert's output (as
    Mixtral's does) instead of its input."""
    from transformers.models.llama4.modeling_llama4 import Llama4TextMoe

    def forward(self: Any, hidden_states: torch.Tensor) -> Any:
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        scores, logits = self.router(hidden_states)
        chosen = (scores > 0).to(hidden_states.dtype).transpose(0, 1).reshape(-1, 1)
        routed = self.experts(hidden_states.repeat(scores.shape[1], 1) * chosen)
        routed = routed * scores.transpose(0, 1).reshape(-1, 1)
        out = self.shared_expert(hidden_states)
        return out + routed.reshape(scores.shape[1], -1, out.shape[-1]).sum(0), logits

    monkeypatch.setattr(Llama4TextMoe, "forward", forward)


# The prompts of 61 and 140 tokens: both cross a window and a chunk, and reach
# positions where the NoPE layer's temperature grows.
ABLATION_PROMPTS = slice(2, 4)
FULL_ATTENTION = ["full_attention", "full_attention"]
# name -> (model, config overrides, weight edit, class patch)
ABLATIONS: dict[str, tuple[str, dict[str, Any], Callable | None, Callable | None]] = {
    "gpt-oss sinks": ("tiny-gpt-oss", {}, no_sinks, None),
    "gpt-oss sliding window": (
        "tiny-gpt-oss", {"layer_types": FULL_ATTENTION}, None, None,
    ),
    "gpt-oss SwiGLU clamp": ("tiny-gpt-oss", {"swiglu_limit": 1e9}, None, None),
    "gpt-oss expert biases": ("tiny-gpt-oss", {}, no_expert_biases, None),
    "llama4 chunked attention": (
        "tiny-llama4", {"layer_types": FULL_ATTENTION}, None, None,
    ),
    "llama4 NoPE layer": ("tiny-llama4", {"no_rope_layers": [1, 1]}, None, None),
    "llama4 temperature tuning": (
        "tiny-llama4", {"attn_temperature_tuning": False}, None, None,
    ),
    "llama4 routing weights on the input": (
        "tiny-llama4", {}, None, routing_weights_on_output,
    ),
    "llama4 shared expert": ("tiny-llama4", {}, no_shared_expert, None),
}  # fmt: skip


@torch.no_grad()
def greedy_tokens(model: torch.nn.Module, prompts: list[list[int]]) -> list[list[int]]:
    """Greedy continuations of an in-memory transformers model, as hf_greedy's
    (its KV cache is the ablated model's own)."""
    outputs = []
    for prompt in prompts:
        input_ids, past, generated = torch.tensor([prompt]), None, []
        for _ in range(MAX_TOKENS):
            result = model(input_ids=input_ids, past_key_values=past, use_cache=True)
            past = result.past_key_values
            generated.append(int(result.logits[0, -1].argmax()))
            input_ids = torch.tensor([generated[-1:]])
        outputs.append(generated)
    return outputs


@pytest.mark.parametrize("ablation", sorted(ABLATIONS))
def test_family_feature_changes_the_tokens(
    ablation: str, monkeypatch: pytest.MonkeyPatch
):
    from transformers import AutoModelForCausalLM

    name, overrides, edit, patch = ABLATIONS[ablation]
    expected = reference(name)  # before a class patch can reach it
    if patch is not None:
        patch(monkeypatch)
    model = AutoModelForCausalLM.from_pretrained(
        model_path(name), dtype=torch.float32, **overrides
    ).eval()
    if edit is not None:
        edit(model)
    first, _ = prompt_batches(name)
    longest = first[ABLATION_PROMPTS]
    ablated = greedy_tokens(model, longest)
    assert ablated != expected[ABLATION_PROMPTS], (
        f"{ablation}: turned off, the tokens stay the same"
    )
