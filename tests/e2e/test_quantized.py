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


def build_wide_llama(path: Path) -> int:
    """A random Llama whose linear layers hold almost all its weights; returns
    its parameter count."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256,
        hidden_size=1024,
        intermediate_size=2048,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def test_packed_checkpoint_holds_under_30_percent_of_bf16_weight_bytes(tmp_path):
    params = build_wide_llama(tmp_path / "bf16")
    quant_dir, _ = write_checkpoints(tmp_path / "bf16", tmp_path, Scheme("awq"))
    with vllm_engine(
        str(quant_dir),
        dtype="bfloat16",
        enforce_eager=True,
        skip_tokenizer_init=True,
        max_model_len=128,
        max_num_seqs=4,
    ) as llm:
        held = llm.apply_model(tensor_bytes)[0]
    # 4-bit linears with 16-bit scales and zeros, and 16-bit embeddings: about 27%.
    # (The emulated device meter counts the process's resident memory, checkpoint
    # pages and loader buffers included, so it cannot tell 27% from 30% here.)
    assert 0.25 * 2 * params < held <= 0.3 * 2 * params


def tensor_bytes(model: torch.nn.Module) -> int:
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def prompt_logprobs(llm, prompts: list[list[int]]) -> torch.Tensor:
    """The log-probability the model gives each prompt token after the first."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0)
    results = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    values = [
        step[token].logprob
        for prompt, r in zip(prompts, results, strict=True)
        for token, step in zip(prompt[1:], r.prompt_logprobs[1:], strict=True)
    ]
    return torch.tensor(values)


def test_online_fp8_keeps_fp8_weights_and_close_logprobs():
    prompts = random_prompts([24, 40], 1024, seed=2)
    path = model_path("tiny-llama")
    kwargs = {"dtype": "bfloat16", "enforce_eager": True, "max_model_len": 128}
    with vllm_engine(path, **kwargs) as llm:
        expected = prompt_logprobs(llm, prompts)
    with vllm_engine(path, quantization="fp8", **kwargs) as llm:
        actual = prompt_logprobs(llm, prompts)
        dtypes = llm.apply_model(linear_weight_dtypes)[0]
    assert dtypes == {torch.float8_e4m3fn}
    # Random tiny weights give logprobs of -8.3 +- 1.9 here; fp8 weights and
    # activations move them by 0.3 (rms): allow a quarter of their spread.
    error = (actual - expected).norm()
    assert error <= 0.25 * (expected - expected.mean()).norm()


def linear_weight_dtypes(model: torch.nn.Module) -> set[torch.dtype]:
    from vllm.model_executor.layers.linear import LinearBase

    return {m.weight.dtype for m in model.modules() if isinstance(m, LinearBase)}
