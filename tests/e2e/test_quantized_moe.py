"""Quantized experts, written locally in each format's published layout from the
tiny MoE models (DeepSeek-V2 and Qwen3-MoE: transformers loads their experts
correctly; gpt-oss in OpenAI's MXFP4), generate on the plugin exactly what
transformers generates from the dequantized weights (float32), and their
weights stay packed on the device. A prompt run alone decodes one token a
step: 2 pairs, fewer than the experts, so each step dequantizes only the
experts it routes to (ops/moe.py::routed_experts)."""

import json
from pathlib import Path

import pytest
import torch
from models import model_path
from moe_checkpoints import Fp8Experts, write_moe_checkpoints
from quant_checkpoints import (
    FP8_DTYPE,
    FP8_MAX,
    Scheme,
    input_quantizer,
    quantize_inputs,
)
from safetensors.torch import load_file

from e2e.harness import (
    engine_spec,
    hf_greedy,
    random_prompts,
    uses_engines,
    vllm_engine,
    vllm_greedy,
)

pytestmark = pytest.mark.slow

MAX_TOKENS = 8
LENGTHS = [3, 17, 40]
INPUT_SCALE = 0.05  # static fp8 input scale of the per-tensor checkpoint
CASES = {
    "deepseek-v2-fp8-block": ("tiny-deepseek-v2-moe", Fp8Experts()),
    "qwen3-fp8-tensor-static": ("tiny-qwen3-moe", Fp8Experts(None, INPUT_SCALE)),
    "qwen3-awq-g64": ("tiny-qwen3-moe", Scheme("awq", group_size=64)),
    "qwen3-gptq-sym-g32": ("tiny-qwen3-moe", Scheme("gptq", group_size=32, sym=True)),
}
# Experts' bytes against bf16 at most (benchmarks/moe_memory.py: whole models,
# read from the device meter).
FP8_EXPERT_BYTES, INT4_EXPERT_BYTES = 0.55, 0.30
METHODS = {
    Fp8Experts: "HpuFp8MoEMethod",
    "awq": "HpuAWQMoEMethod",
    "gptq": "HpuGPTQMoEMethod",
}


def round_expert_inputs(scale: float):  # type: ignore[no-untyped-def]
    """transformers' experts get their input rounded through fp8 with the
    checkpoint's static scale, as the plugin's experts do."""

    def round_input(_module, args):  # type: ignore[no-untyped-def]
        x = args[0]
        q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
        return ((q.float() * scale).to(x.dtype), *args[1:])

    def prepare(model: torch.nn.Module) -> None:
        for name, module in model.named_modules():
            if name.endswith("mlp.experts"):
                module.register_forward_pre_hook(round_input)

    return prepare


def expert_methods(model: torch.nn.Module) -> tuple[set[str], float]:
    """The experts' methods, and the bytes their tensors hold against the same
    experts in bf16 (their scales counted in bf16 too: these models run in
    float32, which vLLM gives the scales)."""
    from vllm.model_executor.layers.fused_moe import RoutedExperts

    layers = [m for m in model.modules() if isinstance(m, RoutedExperts)]
    held = sum(
        t.numel() * (2 if t.dtype == torch.float32 else t.element_size())
        for layer in layers
        for t in layer.parameters()
    )
    bf16 = sum(
        2 * 3 * layer.local_num_experts * layer.hidden_size
        * layer.intermediate_size_per_partition
        for layer in layers
    )  # fmt: skip
    return {type(layer.quant_method).__name__ for layer in layers}, held / bf16


@pytest.mark.parametrize("case", CASES)
def test_quantized_experts_generate_what_transformers_does(case, tmp_path):
    name, scheme = CASES[case]
    quant_dir, deq_dir = write_moe_checkpoints(Path(model_path(name)), tmp_path, scheme)
    prompts = random_prompts(LENGTHS, 1024, seed=1)
    static = isinstance(scheme, Fp8Experts) and scheme.input_scale is not None
    prepare = round_expert_inputs(INPUT_SCALE) if static else None
    expected = hf_greedy(
        str(deq_dir), prompts, MAX_TOKENS, torch.float32, prepare=prepare
    )
    with vllm_engine(str(quant_dir), enforce_eager=True) as llm:
        methods, held = llm.apply_model(expert_methods)[0]
        actual = vllm_greedy(llm, prompts, MAX_TOKENS)
        alone = vllm_greedy(llm, prompts[-1:], MAX_TOKENS)  # routed experts only
    assert alone == expected[-1:]
    fp8 = isinstance(scheme, Fp8Experts)
    print(f"{case}: experts hold {held:.1%} of their bf16 bytes")
    assert methods == {METHODS[Fp8Experts if fp8 else scheme.method]}
    # The experts stay packed: fp8 (with its scales) or 4 bits (with groups').
    assert held <= (FP8_EXPERT_BYTES if fp8 else INT4_EXPERT_BYTES)
    assert actual == expected


# (base model, scheme) written by llm-compressor in the set-up
# (scripts/llmcompressor_checkpoints.py), and the experts' method.
COMPRESSED = {
    ("tiny-deepseek-v2-moe", "w4a16-g32"): "HpuCompressedTensorsWNA16MoEMethod",
    ("tiny-qwen3-moe", "w4a16-asym-g64"): "HpuCompressedTensorsWNA16MoEMethod",
    ("tiny-deepseek-v2-moe", "mxfp4a16"): "HpuCompressedTensorsMxfp4MoEMethod",
    ("tiny-qwen3-moe", "fp8-block"): "HpuCompressedTensorsW8A8Fp8MoEMethod",
}


def quantized_linear_inputs(quant_dir: Path):  # type: ignore[no-untyped-def]
    """transformers' linear layers (not its fused experts: block-fp8 experts
    take their input as it is) get their input quantized as the checkpoint's."""
    config = json.loads((quant_dir / "config.json").read_text())
    quantizer = input_quantizer(config["quantization_config"])
    state = load_file(quant_dir / "model.safetensors")
    scales = {n[: -len(".input_scale")]: t for n, t in state.items() if "input_s" in n}

    def prepare(model: torch.nn.Module) -> None:
        if quantizer is not None:
            quantize_inputs(model, quantizer, scales)

    return prepare


@pytest.mark.parametrize(
    ("name", "scheme"), list(COMPRESSED), ids=[f"{n}-{s}" for n, s in COMPRESSED]
)
def test_compressed_tensors_experts_generate_what_transformers_does(name, scheme):
    quant_dir = Path(model_path(f"{name}-ct-{scheme}"))
    deq_dir = Path(model_path(f"{name}-ct-{scheme}-dequantized"))
    prompts = random_prompts(LENGTHS, 1024, seed=1)
    prepare = quantized_linear_inputs(quant_dir)
    expected = hf_greedy(
        str(deq_dir), prompts, MAX_TOKENS, torch.float32, prepare=prepare
    )
    with vllm_engine(str(quant_dir), enforce_eager=True) as llm:
        methods, held = llm.apply_model(expert_methods)[0]
        actual = vllm_greedy(llm, prompts, MAX_TOKENS)
        alone = vllm_greedy(llm, prompts[-1:], MAX_TOKENS)  # routed experts only
    assert alone == expected[-1:]
    assert methods == {COMPRESSED[name, scheme]}
    fp8 = scheme.startswith("fp8")
    print(f"{name} {scheme}: experts hold {held:.1%} of their bf16 bytes")
    assert held <= (FP8_EXPERT_BYTES if fp8 else INT4_EXPERT_BYTES)
    assert actual == expected


# gpt-oss as OpenAI ships it (tiny-gpt-oss's experts in MXFP4, written by
# scripts/tiny_mxfp4.py): prompts of mixed lengths around the 40-token window,
# the longest in chunks of a 48-token step budget.
GPT_OSS_MXFP4 = engine_spec(
    "tiny-gpt-oss-mxfp4",
    block_size=16,
    max_model_len=256,
    max_num_batched_tokens=48,
    enable_chunked_prefill=True,
)
GPT_OSS_LENGTHS = [3, 17, 40, 61]


def experts_in_float32(model: torch.nn.Module) -> None:
    """transformers dequantizes the MXFP4 experts to bf16 (exactly: an e2m1
    value times a power of two is a bf16 value) and keeps them in bf16; the
    rest of the model computes in float32, as the plugin's experts do."""
    model.float()


@uses_engines(GPT_OSS_MXFP4)
def test_gpt_oss_mxfp4_generates_what_transformers_does(llm):
    path = model_path("tiny-gpt-oss-mxfp4")
    prompts = random_prompts(GPT_OSS_LENGTHS, 1024, seed=1)
    expected = hf_greedy(
        path, prompts, MAX_TOKENS, torch.float32, prepare=experts_in_float32
    )
    methods, held = llm.apply_model(expert_methods)[0]
    actual = vllm_greedy(llm, prompts, MAX_TOKENS)
    assert vllm_greedy(llm, prompts[-1:], MAX_TOKENS) == expected[-1:]
    print(f"gpt-oss mxfp4: experts hold {held:.1%} of their bf16 bytes")
    assert methods == {"HpuGptOssMxfp4MoEMethod"}
    assert held <= INT4_EXPERT_BYTES
    assert actual == expected
