"""Checkpoints as models ship quantized, generating on the plugin exactly what
transformers generates from the dequantized weights (float32), with activations
quantized the same way where the checkpoint quantizes them.

compressed-tensors checkpoints are written by llm-compressor in the test set-up
(scripts/build_quant_checkpoints.py); ``fp8`` checkpoints (DeepSeek-V3's block
layout, per-tensor scales) by tests/quant_checkpoints.py.
"""

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from models import model_path
from quant_checkpoints import (
    Fp8Scheme,
    fp8_per_token,
    input_quantizer,
    quantize_inputs,
    write_checkpoints,
)
from safetensors.torch import load_file

from e2e.harness import (
    default_engine,
    hf_greedy,
    random_prompts,
    vllm_engine,
    vllm_greedy,
)

pytestmark = pytest.mark.slow

MAX_TOKENS = 12
LENGTHS = [3, 17, 40]
BUILD = "run `python scripts/build_quant_checkpoints.py .cache/models`"

# (base model, scheme written by scripts/llmcompressor_checkpoints.py), and the
# dtype its linear weights keep in device memory.
COMPRESSED = {
    ("tiny-llama", "fp8-dynamic"): torch.float8_e4m3fn,
    ("tiny-qwen2", "fp8-static"): torch.float8_e4m3fn,
    ("tiny-llama", "fp8-block"): torch.float8_e4m3fn,
    ("tiny-llama", "w4a16-g32"): torch.int32,
    ("tiny-qwen2", "w4a16-asym-g64"): torch.int32,
    ("tiny-llama", "w8a16-channel"): torch.int32,
    ("tiny-llama", "mxfp4a16"): torch.uint8,
}


def compressed_path(name: str) -> Path:
    path = Path(model_path("tiny-llama")).parent / name
    if not (path / "config.json").is_file():
        pytest.fail(f"{path} is missing: {BUILD}")
    return path


def quantized_inputs(quant_dir: Path) -> Callable[[torch.nn.Module], None]:
    """Hooks that quantize each quantized layer's input as the checkpoint asks
    (static scales read from it), for transformers' model."""
    config = json.loads((quant_dir / "config.json").read_text())
    quantizer = input_quantizer(config["quantization_config"])
    scales = {
        name.removesuffix(".input_scale"): tensor
        for name, tensor in load_file(quant_dir / "model.safetensors").items()
        if name.endswith(".input_scale")
    }

    def prepare(model: torch.nn.Module) -> None:
        if quantizer is not None:
            quantize_inputs(model, quantizer, scales)

    return prepare


def reference_greedy(
    quant_dir: Path, deq_dir: Path, prompts: list[list[int]]
) -> list[list[int]]:
    """transformers on the dequantized weights, inputs quantized alike."""
    prepare = quantized_inputs(quant_dir)
    return hf_greedy(str(deq_dir), prompts, MAX_TOKENS, torch.float32, prepare=prepare)


def check_generation(
    quant_dir: Path, deq_dir: Path, method: str, engine: Callable = vllm_engine
) -> set[torch.dtype]:
    """Assert the greedy match; return the dtypes the linear weights kept."""
    vocab = json.loads((quant_dir / "config.json").read_text())["vocab_size"]
    prompts = random_prompts(LENGTHS, vocab, seed=1)
    expected = reference_greedy(quant_dir, deq_dir, prompts)
    with engine(str(quant_dir), enforce_eager=True) as llm:
        assert llm.llm_engine.model_config.quantization == method
        actual = vllm_greedy(llm, prompts, MAX_TOKENS)
        dtypes = llm.apply_model(linear_weight_dtypes)[0]
    assert actual == expected
    return dtypes


def linear_weight_dtypes(model: torch.nn.Module) -> set[torch.dtype]:
    """The dtypes of the quantized linear layers' weights (not the LM head's)."""
    from vllm.model_executor.layers.linear import LinearBase

    names = ("weight", "weight_packed")
    return {
        tensor.dtype
        for module in model.modules()
        if isinstance(module, LinearBase)
        for name in names
        if isinstance(tensor := getattr(module, name, None), torch.Tensor)
    }


@pytest.mark.parametrize(
    ("name", "scheme"), list(COMPRESSED), ids=lambda v: v if "-" in v else None
)
def test_compressed_tensors_generation_matches_hf(name, scheme):
    quant_dir = compressed_path(f"{name}-ct-{scheme}")
    deq_dir = compressed_path(f"{name}-ct-{scheme}-dequantized")
    dtypes = check_generation(quant_dir, deq_dir, "compressed-tensors")
    assert dtypes == {COMPRESSED[name, scheme]}


@torch.no_grad()
def reference_logprobs(
    deq_dir: Path, sequences: list[list[int]], prepare: Callable | None
) -> list[torch.Tensor]:
    """transformers' log-probability of each token after the first."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(deq_dir, dtype=torch.float32)
    if prepare is not None:
        prepare(model)
    values = []
    for seq in sequences:
        logits = model(torch.tensor([seq])).logits[0, :-1].float()
        values.append(logits.log_softmax(-1).gather(1, torch.tensor(seq[1:])[:, None]))
    return [v.flatten() for v in values]


def vllm_logprobs(llm, prompts: list[list[int]]) -> tuple[list, list[torch.Tensor]]:
    """vLLM's greedy sequences and the log-probability it gave each token after
    the first (prompt tokens, then generated ones)."""
    from vllm import SamplingParams

    params = SamplingParams(
        temperature=0.0,
        max_tokens=MAX_TOKENS,
        ignore_eos=True,
        logprobs=0,
        prompt_logprobs=0,
    )
    sequences, values = [], []
    for prompt, r in zip(
        prompts,
        llm.generate([{"prompt_token_ids": p} for p in prompts], params),
        strict=True,
    ):
        out = r.outputs[0]
        seq = [*prompt, *out.token_ids]
        steps = [*r.prompt_logprobs[1:], *out.logprobs]
        sequences.append(seq)
        values.append(
            torch.tensor([s[t].logprob for s, t in zip(steps, seq[1:], strict=True)])
        )
    return sequences, values


def test_w8a8_int8_logprobs_match_hf_with_int8_activations():
    """Not token for token: int8 rounding of activations turns the float32 noise
    between two implementations (1e-6) into whole int8 steps (a hundredth of a
    token's largest value) now and then, and this random model has near-ties
    (top-2 margins of 6e-4) that such a step tips. Over the log-probabilities of
    prompt and greedy tokens: the median distance to transformers with int8
    activations is under 1e-4 and the root mean square under 0.05 (0.017 here);
    the median distance to float activations is over 1e-2 (0.04 here)."""
    quant_dir = compressed_path("tiny-llama-ct-w8a8-int8")
    deq_dir = compressed_path("tiny-llama-ct-w8a8-int8-dequantized")
    prompts = random_prompts(LENGTHS, 1024, seed=1)
    with vllm_engine(str(quant_dir), enforce_eager=True) as llm:
        sequences, actual = vllm_logprobs(llm, prompts)
        dtypes = llm.apply_model(linear_weight_dtypes)[0]
    assert dtypes == {torch.int8}
    int8_inputs = reference_logprobs(deq_dir, sequences, quantized_inputs(quant_dir))
    float_inputs = reference_logprobs(deq_dir, sequences, None)
    error = (torch.cat(actual) - torch.cat(int8_inputs)).abs()
    moved = (torch.cat(actual) - torch.cat(float_inputs)).abs()
    assert error.median() < 1e-4 and error.pow(2).mean().sqrt() < 0.05
    assert moved.median() > 1e-2


@pytest.mark.parametrize(
    ("name", "scheme"),
    [
        ("tiny-llama", Fp8Scheme(block_size=(128, 128))),
        ("tiny-qwen2", Fp8Scheme(block_size=None, activation_scheme="static")),
    ],
    ids=["block-128", "tensor-static"],
)
def test_fp8_checkpoint_generation_matches_hf(name, scheme, tmp_path):
    quant_dir, deq_dir = write_checkpoints(Path(model_path(name)), tmp_path, scheme)
    # Block scales through vLLM's default engine (its core in its own process).
    engine = default_engine if scheme.block_size else vllm_engine
    dtypes = check_generation(quant_dir, deq_dir, "fp8", engine)
    assert dtypes == {torch.float8_e4m3fn}


def test_fp8_dynamic_per_tensor_checkpoint_is_close_to_its_declared_inputs(tmp_path):
    """``activation_scheme: dynamic`` with per-tensor weights declares one input
    scale per tensor; the plugin quantizes per token (finer, and a sequence's
    tokens then do not depend on its batch; vLLM does the same with CUTLASS,
    and so does the reference Gaudi plugin). Over the log-probabilities of
    prompt and greedy tokens: against transformers quantizing each input per
    tensor, as declared, within DECLARED_RMS; against transformers quantizing
    per token, exact to float32 noise; and quantized at all (float inputs
    differ)."""
    name = "tiny-llama"
    scheme = Fp8Scheme(block_size=None, activation_scheme="dynamic")
    quant_dir, deq_dir = write_checkpoints(Path(model_path(name)), tmp_path, scheme)
    prompts = random_prompts(LENGTHS, 1024, seed=1)
    with vllm_engine(str(quant_dir), enforce_eager=True) as llm:
        sequences, actual = vllm_logprobs(llm, prompts)
    declared = reference_logprobs(deq_dir, sequences, quantized_inputs(quant_dir))
    per_token = reference_logprobs(deq_dir, sequences, inputs_per_token)
    float_inputs = reference_logprobs(deq_dir, sequences, None)
    plugin = torch.cat(actual)
    off = {
        label: (plugin - torch.cat(values)).abs()
        for label, values in [
            ("declared", declared),
            ("per token", per_token),
            ("float", float_inputs),
        ]
    }
    print(
        {
            k: (f"{v.median():.2e}", f"{v.pow(2).mean().sqrt():.2e}")
            for k, v in off.items()
        }
    )
    assert off["declared"].pow(2).mean().sqrt() < DECLARED_RMS
    assert off["per token"].median() < 1e-4
    assert off["float"].median() > 1e-2


# The log-probabilities of the plugin's per-token run against transformers
# quantizing each input per tensor, as the checkpoint declares: root mean
# square of the differences (measured 0.33, median 0.20). One scale per tensor
# is the coarser rounding: float inputs are nearer the plugin (rms 0.22) than
# the declared ones; per token, transformers and the plugin agree to 1.6e-4.
DECLARED_RMS = 0.5


def inputs_per_token(model: torch.nn.Module) -> None:
    quantize_inputs(model, fp8_per_token, {})


def tensor_bytes(model: torch.nn.Module) -> int:
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def bf16_bytes(path: Path) -> int:
    return 2 * sum(t.numel() for t in load_file(path / "model.safetensors").values())


def weights_memory(worker: Any) -> int:
    """In the engine's process: what loading the model took on the device
    meter (the runner reads it around load_model)."""
    return worker.model_runner.weights_memory


# A wide model, small otherwise: engines whose meter readings are compared.
WIDE_ENGINE = {
    "dtype": "bfloat16",
    "enforce_eager": True,
    "skip_tokenizer_init": True,
    "max_model_len": 128,
    "max_num_seqs": 4,
}


@functools.cache
def metered_load(model_dir: str) -> tuple[int, int]:
    """(device meter bytes, tensor bytes) of loading ``model_dir``, in an engine
    process of its own (vLLM's default engine): the meter counts the growth of
    the process's memory, so any copy of the weights kept anywhere shows."""
    with default_engine(model_dir, **WIDE_ENGINE) as llm:
        (metered,) = llm.collective_rpc(weights_memory)
        held = llm.apply_model(tensor_bytes)[0]
    return metered, held


def assert_meter_saw_the_saving(quant_dir: Path, wide: Path) -> int:
    """The quantized load against the bf16 one on the device meter: what it saved
    there is what its tensors save (a bf16 copy kept beside the quantized weights
    would save nothing). Differences, as each load's own growth (the loader's,
    imports) is the same for both and varies by machine. Returns the tensor
    bytes the quantized model holds."""
    metered, held = metered_load(str(quant_dir))
    bf16_metered, _ = metered_load(str(wide))
    tensor_saving = bf16_bytes(wide) - held
    meter_saving = bf16_metered - metered
    print(f"{quant_dir.name}: the meter saw {meter_saving / tensor_saving:.0%} saved")
    assert 0.8 * tensor_saving <= meter_saving <= 1.2 * tensor_saving
    return held


@pytest.mark.parametrize(
    ("scheme", "share"),
    [
        ("fp8-block", 0.55),
        ("w4a16-g128", 0.3),
        ("mxfp4a16", 0.3),
    ],
)
def test_quantized_weights_stay_small_in_device_memory(scheme, share, tmp_path):
    """A Llama whose linear layers hold almost all its weights, loaded quantized
    and in bf16, each in an engine process of its own: what the device meter
    saw each load take, and the tensors the quantized model holds against the
    bf16 model's (fp8 about 51 %, 4 bits with scales about 28 %; the lower
    bound shows the weights did load)."""
    wide = compressed_path("wide-llama")
    if scheme == "fp8-block":
        quant_dir, _ = write_checkpoints(wide, tmp_path, Fp8Scheme((128, 128)))
    else:
        quant_dir = compressed_path(f"wide-llama-ct-{scheme}")
    held = assert_meter_saw_the_saving(quant_dir, wide)
    assert share - 0.1 < held / bf16_bytes(wide) <= share
