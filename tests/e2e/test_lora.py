"""LoRA through vLLM on the plugin equals transformers with the adapter merged,
token for token in float32: adapters of different ranks and target modules, and
requests without an adapter, in the same batches, with prefix caching on."""

import json

import pytest
import torch
from conftest import MODELS_DIR
from models import model_path as model_dir
from vllm import SamplingParams
from vllm.lora.request import LoRARequest

from e2e.harness import hf_greedy, random_prompts, vllm_engine
from e2e.lora_adapters import ATTENTION, ATTENTION_MLP, AdapterSpec, build_adapter
from e2e.lora_adapters import merge_adapter

pytestmark = pytest.mark.slow

MAX_TOKENS = 8
MAX_LORA_RANK = 16
# Adapter 1 low rank on attention; adapter 2 full rank on attention and MLP.
ADAPTERS = (AdapterSpec(4, ATTENTION, seed=1), AdapterSpec(16, ATTENTION_MLP, seed=2))
# Per prompt: the adapter it runs with (0: none); two prompts share a prefix.
PROMPT_LORAS = [1, 0, 2, 1, 2, 0]
LENGTHS = [20, 9, 33, 20, 5, 40]


def _prompts(name: str) -> list[list[int]]:
    vocab_size = json.loads((MODELS_DIR / name / "config.json").read_text())[
        "vocab_size"
    ]
    prompts = random_prompts(LENGTHS, vocab_size)
    prompts[3] = prompts[0][:16] + prompts[3][16:]  # a prefix-cache hit, adapter 1
    return prompts


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_lora_generations_match_merged_adapters(name, tmp_path):
    base = model_dir(name)
    adapters = [
        build_adapter(base, spec, tmp_path / f"adapter{i}")
        for i, spec in enumerate(ADAPTERS, start=1)
    ]
    models = [base] + [
        merge_adapter(base, adapter, tmp_path / f"merged{i}")
        for i, adapter in enumerate(adapters, start=1)
    ]
    prompts = _prompts(name)
    expected = [
        hf_greedy(models[lora_id], [prompt], MAX_TOKENS, torch.float32)[0]
        for prompt, lora_id in zip(prompts, PROMPT_LORAS, strict=True)
    ]
    requests = [None] + [
        LoRARequest(f"adapter{i}", i, str(path))
        for i, path in enumerate(adapters, start=1)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    with vllm_engine(
        base,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=MAX_LORA_RANK,
        enable_prefix_caching=True,
        max_model_len=128,
    ) as llm:
        results = llm.generate(
            [{"prompt_token_ids": p} for p in prompts],
            params,
            lora_request=[requests[i] for i in PROMPT_LORAS],
        )
    actual = [list(r.outputs[0].token_ids) for r in results]
    assert expected[0] != hf_greedy(base, prompts[:1], MAX_TOKENS, torch.float32)[0]
    for i, (want, got) in enumerate(zip(expected, actual, strict=True)):
        assert got == want, f"prompt {i} (adapter {PROMPT_LORAS[i]}) diverged"
