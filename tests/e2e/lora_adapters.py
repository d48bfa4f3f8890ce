"""Tiny PEFT LoRA adapters for a local model: random A and, unlike PEFT's zero
start, random non-zero B, so an adapter changes what the model generates."""

from dataclasses import dataclass
from pathlib import Path

import torch

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
ATTENTION_MLP = (*ATTENTION, "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class AdapterSpec:
    rank: int
    target_modules: tuple[str, ...]
    seed: int
    alpha: int = 16


def build_adapter(model_dir: str, spec: AdapterSpec, out_dir: Path) -> Path:
    """Save a PEFT adapter of ``spec`` for ``model_dir`` under ``out_dir``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        target_modules=list(spec.target_modules),
        lora_dropout=0.0,
    )
    model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    model.save_pretrained(out_dir)
    return out_dir


def merge_adapter(model_dir: str, adapter_dir: Path, out_dir: Path) -> str:
    """Save the base model with the adapter merged in (PEFT's merge_and_unload)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    merged.save_pretrained(out_dir)
    return str(out_dir)


def rename_target(adapter_dir: Path, old: str, new: str, out_dir: Path) -> Path:
    """A copy of the adapter aimed at module ``new``, which the model lacks."""
    from safetensors.torch import load_file, save_file

    out_dir.mkdir(parents=True)
    weights = load_file(adapter_dir / "adapter_model.safetensors")
    renamed = {name.replace(old, new): tensor for name, tensor in weights.items()}
    save_file(renamed, out_dir / "adapter_model.safetensors")
    config = (adapter_dir / "adapter_config.json").read_text()
    (out_dir / "adapter_config.json").write_text(config.replace(old, new))
    return out_dir
