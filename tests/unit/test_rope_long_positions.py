"""Rope scaling at every position up to 131072: vLLM's rotary embeddings as the
plugin runs them (forward_native, no fused kernel in emulation) vs transformers'
for the long-context tiny models' configs: Llama 3.1's llama3, Qwen2's YaRN,
Phi-3's LongRoPE, and dynamic NTK on the Llama config.

Positions sampled over the whole range, the last one included, so transformers
computes the frequencies of a 131072-token sequence (LongRoPE's long factors,
dynamic NTK's length); queries and keys are random, so a wrong frequency,
attention factor or cache length anywhere shows. Cheap (no attention); the
end-to-end test (tests/e2e/test_long_context.py) runs the models on prompts
of 100k tokens.
"""

import dataclasses
import importlib
from types import SimpleNamespace

import pytest
import torch
from models import model_path
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.layers.rotary_embedding import (
    phi3_long_rope_scaled_rope as longrope,
)
from vllm.transformers_utils.config import get_config

MAX_POSITION = 131072
DYNAMIC = {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 500000.0}


@dataclasses.dataclass(frozen=True)
class RopeCase:
    model: str
    rope_parameters: dict | None = None  # type: ignore[type-arg]  # None: the model's

    def __str__(self) -> str:
        kind = (self.rope_parameters or {}).get("rope_type", "")
        return f"{self.model}{'-' + kind if kind else ''}"


CASES = [
    RopeCase("tiny-llama3-128k"),
    RopeCase("tiny-qwen2-yarn-128k"),
    RopeCase("tiny-phi3-longrope-128k"),
    RopeCase("tiny-llama3-128k", DYNAMIC),
]


def _positions() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    middle = torch.randint(0, MAX_POSITION, (960,), generator=gen)
    edges = torch.cat((torch.arange(32), torch.arange(MAX_POSITION - 32, MAX_POSITION)))
    return torch.cat((edges[:32], middle, edges[32:]))


def _hf_rotate(config, positions, query, key):  # type: ignore[no-untyped-def]
    """transformers' rotary embedding of the model type, applied as its attention
    applies it. query, key: [n, heads, head_dim]."""
    module = importlib.import_module(
        f"transformers.models.{config.model_type}.modeling_{config.model_type}"
    )
    prefix = {"llama": "Llama", "qwen2": "Qwen2", "phi3": "Phi3"}[config.model_type]
    rotary = getattr(module, f"{prefix}RotaryEmbedding")(config)
    cos, sin = rotary(query, positions[None])
    q, k = module.apply_rotary_pos_emb(
        query.transpose(0, 1)[None], key.transpose(0, 1)[None], cos, sin
    )
    return q[0].transpose(0, 1), k[0].transpose(0, 1)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_rope_matches_transformers_up_to_131072(case: RopeCase, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Phi-3's LongRoPE asks vLLM's config for max_model_len (long factors when
    # it exceeds the original length), as an engine at 131072 would answer.
    served = SimpleNamespace(model_config=SimpleNamespace(max_model_len=MAX_POSITION))
    monkeypatch.setattr(longrope, "get_current_vllm_config", lambda: served)
    config = get_config(model_path(case.model), trust_remote_code=False)
    if case.rope_parameters is not None:
        config.rope_parameters = dict(case.rope_parameters)
    head_dim = config.hidden_size // config.num_attention_heads
    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(
            head_dim,
            max_position=config.max_position_embeddings,
            rope_parameters=config.rope_parameters,
            dtype=torch.float32,
        )
    positions = _positions()
    gen = torch.Generator().manual_seed(1)
    query = torch.randn(len(positions), 2, head_dim, generator=gen)
    key = torch.randn(len(positions), 1, head_dim, generator=gen)

    forward = getattr(rope, "forward_native", rope.forward)
    got_q, got_k = forward(positions, query.flatten(1), key.flatten(1))
    want_q, want_k = _hf_rotate(config, positions, query, key)

    torch.testing.assert_close(got_q.view_as(query), want_q, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got_k.view_as(key), want_k, atol=1e-4, rtol=1e-4)
