"""Quantized checkpoints of the tiny MoE models, written for the tests in the
formats' published layouts, each beside the same model with the dequantized
weights (the reference transformers runs).

fp8: DeepSeek-V3's layout, float8_e4m3fn weights with float32 ``weight_scale_inv``
per 128 x 128 block (or one ``weight_scale`` per tensor, with static
``input_scale``), for the experts; the other linear layers are named in
``modules_to_not_convert``. AWQ / GPTQ: every linear layer, experts included, in
4 bits (``quant_checkpoints.py``). Also a dense model's MLPs upcycled into
experts (``write_upcycled_moe``): a MoE with a trained model's decisive outputs.
"""

import dataclasses
import json
import re
import shutil
from pathlib import Path

import torch
from quant_checkpoints import (
    Scheme,
    dequantize_fp8_reference,
    input_seed,
    layer_tensors,
    quantization_config,
    quantize_fp8,
)
from quant_checkpoints import quantize as quantize_int4
from safetensors.torch import load_file, save_file

EXPERT_PROJECTIONS = ("gate_proj", "up_proj", "down_proj", "w1", "w2", "w3")
INT4_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", *EXPERT_PROJECTIONS)


@dataclasses.dataclass(frozen=True)
class Fp8Experts:
    block_size: tuple[int, int] | None = (128, 128)  # None: one scale per tensor
    input_scale: float | None = None  # static activations: this scale for all


def is_expert(name: str) -> bool:
    return ".experts." in name and name.split(".")[-2] in EXPERT_PROJECTIONS


def _fp8_tensors(
    module: str, weight: torch.Tensor, scheme: Fp8Experts
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    q, scale = quantize_fp8(weight, scheme.block_size)
    tensors = {"weight": q}
    if scheme.block_size is not None:
        tensors["weight_scale_inv"] = scale
    else:
        tensors["weight_scale"] = scale
    if scheme.input_scale is not None:
        tensors["input_scale"] = torch.tensor(scheme.input_scale)
    return tensors, dequantize_fp8_reference(q, scale, scheme.block_size)


def fp8_config(scheme: Fp8Experts, unconverted: list[str]) -> dict:
    static = scheme.input_scale is not None
    config = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "static" if static else "dynamic",
        "modules_to_not_convert": unconverted,
    }
    if scheme.block_size is not None:
        config["weight_block_size"] = list(scheme.block_size)
    return config


def int4_config(scheme: Scheme) -> dict:
    """The routers (``mlp.gate``) stay in 16 bits, as AutoAWQ and GPTQModel
    leave them, and the configs say so."""
    config = quantization_config(scheme)
    if scheme.method == "awq":
        return config | {"modules_to_not_convert": ["mlp.gate"]}
    quantized = [f"self_attn.{name}" for name in INT4_LINEARS[:4]] + ["mlp.experts"]
    return config | {"modules_in_block_to_quantize": quantized}


def write_moe_checkpoints(
    source: Path, out: Path, scheme: "Fp8Experts | Scheme"
) -> tuple[Path, Path]:
    """(quantized, dequantized) model directories under ``out``."""
    quant_dir, deq_dir = out / "quantized", out / "dequantized"
    for d in (quant_dir, deq_dir):
        shutil.copytree(source, d, ignore=shutil.ignore_patterns("*.safetensors"))
    quant_state, deq_state, unconverted = {}, {}, []
    for name, tensor in sorted(load_file(source / "model.safetensors").items()):
        module = name.removesuffix(".weight")
        fp8 = isinstance(scheme, Fp8Experts)
        chosen = is_expert(name) if fp8 else module.split(".")[-1] in INT4_LINEARS
        if name == module or not chosen:
            quant_state[name] = deq_state[name] = tensor
            if fp8 and name != module and tensor.ndim == 2 and "embed" not in name:
                unconverted.append(module)
            continue
        if isinstance(scheme, Fp8Experts):
            tensors, deq = _fp8_tensors(module, tensor, scheme)
        else:
            q = quantize_int4(tensor, scheme, seed=input_seed(module))
            tensors, deq = layer_tensors(q, scheme), q.dequantized()
        deq_state[name] = deq.to(tensor.dtype)
        quant_state |= {f"{module}.{suffix}": t for suffix, t in tensors.items()}
    save_file(quant_state, quant_dir / "model.safetensors")
    save_file(deq_state, deq_dir / "model.safetensors")
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = (
        fp8_config(scheme, unconverted)
        if isinstance(scheme, Fp8Experts)
        else int4_config(scheme)
    )
    (quant_dir / "config.json").write_text(json.dumps(config, indent=1))
    return quant_dir, deq_dir


MLP_PROJECTION = re.compile(r"model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight")
MIXTRAL_NAMES = {"gate": "w1", "down": "w2", "up": "w3"}
# Each expert's rows scaled by its own factors this far around 1: distinct
# experts (their own fp8 scales), a model still answering as the dense one.
UPCYCLE_SPREAD = 0.05


def write_upcycled_moe(
    source: Path, out: Path, num_experts: int = 4, top_k: int = 2
) -> Path:
    """A dense Llama made a Mixtral ("sparse upcycling"): each layer's MLP
    becomes ``num_experts`` experts, the dense MLP with every output row scaled
    by the expert's own factor near 1, behind a random router picking
    ``top_k`` (weights renormalized: the experts' mix stays one MLP). The
    model answers as the dense one does, its greedy choices as decisive as a
    trained model's, while its experts and routing are a MoE's."""
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((source / "config.json").read_text())
    generator = torch.Generator().manual_seed(0)
    state = {}
    for name, tensor in load_file(source / "model.safetensors").items():
        match = MLP_PROJECTION.fullmatch(name)
        if match is None:
            state[name] = tensor
            continue
        layer, projection = match.groups()
        prefix = f"model.layers.{layer}.block_sparse_moe"
        for expert in range(num_experts):
            noise = torch.randn(tensor.shape[0], 1, generator=generator)
            scaled = tensor.float() * (1 + UPCYCLE_SPREAD * noise)
            state[f"{prefix}.experts.{expert}.{MIXTRAL_NAMES[projection]}.weight"] = (
                scaled.to(tensor.dtype)
            )
        if projection == "gate":
            router = torch.randn(
                num_experts, config["hidden_size"], generator=generator
            )
            state[f"{prefix}.gate.weight"] = (0.1 * router).to(tensor.dtype)
    save_file(state, out / "model.safetensors")
    config |= {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "num_local_experts": num_experts,
        "num_experts_per_tok": top_k,
        "sliding_window": None,
    }
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out
