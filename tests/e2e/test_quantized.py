"""4-bit AWQ and GPTQ checkpoints, packed locally from tiny models, generate on the
plugin exactly what transformers generates from the dequantized weights."""

import json
from pathlib import Path

import pytest
import torch
from models import model_path
from quant_checkpoints import Scheme, write_checkpoints

from e2e.harness import (
    default_engine,
    hf_greedy,
    random_prompts,
    vllm_engine,
    vllm_greedy,
)
from e2e.test_quantized_checkpoints import (
    assert_meter_saw_the_saving,
    bf16_bytes,
    compressed_path,
)

pytestmark = pytest.mark.slow

MAX_TOKENS = 12
LENGTHS = [3, 17, 40]


# Through vLLM's default engine (its core in a process of its own): one AWQ and
# one GPTQ scheme; the others run in-process.
DEFAULT_PATH = {("awq", 64), ("gptq", 32)}


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
    default_path = (scheme.method, scheme.group_size) in DEFAULT_PATH
    engine = default_engine if default_path else vllm_engine
    with engine(str(quant_dir), enforce_eager=True) as llm:
        assert llm.llm_engine.model_config.quantization == scheme.method
        actual = vllm_greedy(llm, prompts, MAX_TOKENS)
    assert actual == expected


def test_packed_checkpoint_holds_under_30_percent_of_bf16_weight_bytes(tmp_path):
    """The wide Llama of test_quantized_checkpoints in 4-bit AWQ against its bf16
    checkpoint: on the device meter (engine processes of their own) and in the
    tensors the loaded model holds (4-bit linears with 16-bit scales and zeros,
    and 16-bit embeddings: about 27 %)."""
    wide = compressed_path("wide-llama")
    quant_dir, _ = write_checkpoints(wide, tmp_path, Scheme("awq"))
    held = assert_meter_saw_the_saving(quant_dir, wide)
    assert 0.25 * bf16_bytes(wide) < held <= 0.3 * bf16_bytes(wide)


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
    with default_engine(path, quantization="fp8", **kwargs) as llm:
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
