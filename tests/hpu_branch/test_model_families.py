"""Model families and fp8 checkpoints on the Gaudi branch under the bridge's
double: greedy tokens equal transformers' (float32) for Mixtral (the bridge's
MoE kernel), DeepSeek-V2 (MLA on its latent cache), a block-fp8 dense
checkpoint and block-fp8 experts (compressed-tensors, llm-compressor's
layout), and per-tensor fp8 experts with static input scales (DeepSeek-V3's
``fp8`` layout), which run the bridge's fp8 MoE kernel. One engine per
model, in this process and eager (vLLM's default multiprocess start, HPU
graphs and TP=2 are test_engines.py's); the card is the double's default, a
Gaudi2.

On a Gaudi2, vLLM's activation quantizer is bounded by the card's e4m3 range,
240 (review item D7), where transformers' reference rounds at e4m3's 448: the
reference here rounds each quantized layer's input per token and 128-wide
group at the card's range, and the tokens must be equal, not close (a
reference at 448 differs by the third token)."""

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from e2e.harness import hf_greedy, random_prompts, vllm_engine, vllm_greedy
from e2e.test_quantized_moe import INPUT_SCALE, rounded_experts
from models import model_path
from moe_checkpoints import Fp8Experts, write_moe_checkpoints
from quant_checkpoints import fp8_groups, quantize_inputs

from vllm_hpu import device

MAX_TOKENS = 8
LENGTHS = [3, 17, 40]
# Small limits: the Gaudi branch warms up every bucket these allow.
ENGINE = {
    "enforce_eager": True,
    "block_size": 16,
    "max_model_len": 128,
    "max_num_batched_tokens": 64,
    "max_num_seqs": 4,
}
FP8 = torch.float8_e4m3fn
# Block-fp8 checkpoints (scripts/build_quant_checkpoints.py), and the experts'
# method where the model has experts.
FP8_CHECKPOINTS = {
    "tiny-llama-ct-fp8-block": None,
    "tiny-qwen3-moe-ct-fp8-block": "HpuCompressedTensorsW8A8Fp8MoEMethod",
}


def prompts_for(model_dir: Path) -> list[list[int]]:
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    return random_prompts(LENGTHS, vocab, seed=1)


def weight_kinds(model: torch.nn.Module) -> set[tuple[str, torch.dtype]]:
    """(device type, dtype) of every parameter the worker's model holds."""
    return {(p.device.type, p.dtype) for p in model.parameters()}


def expert_methods(model: torch.nn.Module) -> set[str]:
    from vllm.model_executor.layers.fused_moe import RoutedExperts

    layers = [m for m in model.modules() if isinstance(m, RoutedExperts)]
    return {type(layer.quant_method).__name__ for layer in layers}


def generate(model_dir: Path, prompts: list[list[int]]) -> tuple[list[list[int]], Any]:
    """Greedy tokens of an engine on ``model_dir``; its parameters' kinds and
    its experts' methods (none for a dense model)."""
    with vllm_engine(str(model_dir), **ENGINE) as llm:
        kinds = llm.apply_model(weight_kinds)[0]
        methods = llm.apply_model(expert_methods)[0]
        return vllm_greedy(llm, prompts, MAX_TOKENS), (kinds, methods)


@pytest.mark.parametrize("name", ["tiny-mixtral", "tiny-deepseek-v2"])
def test_family_generates_what_transformers_does(name):
    model_dir = Path(model_path(name))
    prompts = prompts_for(model_dir)
    expected = hf_greedy(str(model_dir), prompts, MAX_TOKENS, torch.float32)
    actual, (kinds, _) = generate(model_dir, prompts)
    assert kinds == {("hpu", torch.float32)}
    assert actual == expected


def card_range_inputs(quant_dir: Path):  # type: ignore[no-untyped-def]
    """Hooks for transformers' model: each quantized linear layer's input
    rounded through fp8 as the checkpoint declares it (per token and group),
    at this card's e4m3 range (transformers' fused experts are not hooked:
    block-fp8 experts take their input as it is)."""
    config = json.loads((quant_dir / "config.json").read_text())
    (group,) = config["quantization_config"]["config_groups"].values()
    inputs = group["input_activations"]
    assert (inputs["strategy"], inputs["dynamic"]) == ("group", True), inputs
    quantizer = fp8_groups(inputs["group_size"], device.fp8_max())

    def prepare(model: torch.nn.Module) -> None:
        quantize_inputs(model, quantizer, {})

    return prepare


@pytest.mark.parametrize("name", FP8_CHECKPOINTS)
def test_block_fp8_checkpoint_generates_what_transformers_does(name):
    """The fp8 weights stay fp8 on the card, the experts in the plugin's
    method; the reference is transformers on the dequantized checkpoint."""
    assert device.fp8_max() == 240.0  # a Gaudi2: the range the reference uses
    quant_dir = Path(model_path(name))
    prompts = prompts_for(quant_dir)
    expected = hf_greedy(
        model_path(f"{name}-dequantized"),
        prompts,
        MAX_TOKENS,
        torch.float32,
        prepare=card_range_inputs(quant_dir),
    )
    actual, (kinds, methods) = generate(quant_dir, prompts)
    assert ("hpu", FP8) in kinds and {kind for kind, _ in kinds} == {"hpu"}
    assert methods == ({FP8_CHECKPOINTS[name]} if FP8_CHECKPOINTS[name] else set())
    assert actual == expected


FP8_MOE_KERNEL = "torch.ops.hpu.mixture_of_experts.fp8_fused_weights"


def test_static_fp8_experts_run_gaudis_fp8_moe_kernel(tmp_path, monkeypatch):
    """Qwen3-MoE's experts in fp8 with one scale per tensor and a static input
    scale: every MoE layer's step runs the bridge's fp8 MoE kernel (the double
    refuses it without its intermediate scale, review item D6). The reference
    rounds the experts' input and intermediate through fp8 with the
    checkpoint's scale; on the Gaudi2 the plugin halves the fp8 weights and
    doubles the scales (values to 224, within 240), which rounds alike."""
    quant_dir, deq_dir = write_moe_checkpoints(
        Path(model_path("tiny-qwen3-moe")), tmp_path, Fp8Experts(None, INPUT_SCALE)
    )
    prompts = prompts_for(quant_dir)
    expected = hf_greedy(
        str(deq_dir),
        prompts,
        MAX_TOKENS,
        torch.float32,
        prepare=rounded_experts(INPUT_SCALE),
    )
    kernel = torch.ops.hpu.mixture_of_experts.fp8_fused_weights
    calls = []

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(kwargs["hidden_states"].shape[0])
        return kernel(*args, **kwargs)

    monkeypatch.setitem(device._KERNELS, FP8_MOE_KERNEL, counted)
    actual, (kinds, methods) = generate(quant_dir, prompts)
    assert ("hpu", FP8) in kinds and methods == {"HpuFp8MoEMethod"}
    assert sum(calls) >= sum(LENGTHS), calls  # every prompt token, at least
    assert actual == expected
