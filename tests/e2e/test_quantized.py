"""4-bit AWQ and GPTQ checkpoints, packed locally from tiny models, generate on the
plugin exactly what transformers generates from the dequantized weights."""

import json
from pathlib import Path

import pytest
import torch
from models import model_path
from quant_checkpoints import Scheme, write_checkpoints

from e2e.harness import hf_greedy, random_prompts, vllm_engine, vllm_greedy

pytestmark = pytest.mark.slow

MAX_TOKENS = 12
LENGTHS = [3, 17, 40]


@pytest.mark.parametrize(
    ("name", "scheme"),
    [
        ("tiny-llama", Scheme("awq", group_size=64)),
        ("tiny-qwen2", Scheme("awq", group_size=128)),
        ("tiny-llama", Scheme("gptq", group_size=32, sym=True)),
        ("tiny-qwen2", Scheme("gptq", group_size=128, desc_act=True)),
        ("tiny-llama", Scheme("gptq", group_size=-1)),
    ],
    ids=lambda v: v if isinstance(v, str) else f"{v.method}-g{v.group_size}",
)
def test_quantized_generation_matches_hf_on_dequantized_weights(name, scheme, tmp_path):
    quant_dir, deq_dir = write_checkpoints(Path(model_path(name)), tmp_path, scheme)
    vocab = json.loads((quant_dir / "config.json").read_text())["vocab_size"]
    prompts = random_prompts(LENGTHS, vocab, seed=1)
    expected = hf_greedy(str(deq_dir), prompts, MAX_TOKENS, torch.float32)
    with vllm_engine(str(quant_dir), enforce_eager=True) as llm:
        assert llm.llm_engine.model_config.quantization == scheme.method
        actual = vllm_greedy(llm, prompts, MAX_TOKENS)
    assert actual == expected
