"""Quantized checkpoints of the tiny MoE models, written for the tests in the
formats' published layouts, each beside the same model with the dequantized
weights (the reference transformers runs).

fp8: DeepSeek-V3's layout, float8_e4m3fn weights with float32 ``weight_scale_inv``
per 128 x 128 block (or one ``weight_scale`` per tensor, with static
``input_scale``), for the experts; the other linear layers are named in
``modules_to_not_convert``. AWQ / GPTQ: every linear layer, experts included, in
4 bits (``quant_checkpoints.py``).
"""

import dataclasses
import json
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
