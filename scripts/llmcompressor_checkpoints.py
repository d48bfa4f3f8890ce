"""Write compressed-tensors checkpoints of the tiny models with llm-compressor.

Run by build_quant_checkpoints.py with llm-compressor and compressed-tensors 0.19
on PYTHONPATH (their pins clash with vLLM's): this process only writes files.
For each scheme it writes ``<model>-ct-<scheme>`` (the compressed checkpoint) and
``<model>-ct-<scheme>-dequantized`` (the same model in float32 with each quantized
weight as compressed-tensors' own ``fake_quantize`` rounds it: the reference
transformers runs; not for wide-llama, which only the memory test loads).
Usage: llmcompressor_checkpoints.py MODELS_DIR
   or: llmcompressor_checkpoints.py SOURCE OUT SCHEME (one checkpoint, a SCHEMES
       name, no dequantized twin; benchmarks/moe_memory.py --dense)
"""

import json
import shutil
import sys
from pathlib import Path

import torch
from compressed_tensors.quantization.lifecycle.forward import fake_quantize
from datasets import Dataset
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import QuantizationModifier
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

BUILD_VERSION = "1"
STAMP_FILE = ".build_version"
WIDE_MODEL = "wide-llama"
CALIBRATION_SAMPLES, CALIBRATION_LENGTH = 4, 32


def int_weights(bits: int, group_size: int | None, symmetric: bool) -> dict:
    strategy = "channel" if group_size is None else "group"
    args = {"num_bits": bits, "type": "int", "symmetric": symmetric}
    return {"weights": args | {"strategy": strategy, "group_size": group_size}}


# name: (preset or config group, base models)
SCHEMES: dict[str, tuple[str | dict, tuple[str, ...]]] = {
    "fp8-dynamic": ("FP8_DYNAMIC", ("tiny-llama",)),
    "fp8-static": ("FP8", ("tiny-qwen2",)),
    "fp8-block": ("FP8_BLOCK", ("tiny-llama", "tiny-qwen3-moe")),
    "w8a8-int8": ("W8A8", ("tiny-llama",)),
    "w4a16-g32": (int_weights(4, 32, True), ("tiny-llama", "tiny-deepseek-v2-moe")),
    "w4a16-g128": ("W4A16", (WIDE_MODEL,)),
    "w4a16-asym-g64": (int_weights(4, 64, False), ("tiny-qwen2", "tiny-qwen3-moe")),
    "w8a16-channel": (int_weights(8, None, True), ("tiny-llama",)),
    "mxfp4a16": ("MXFP4A16", ("tiny-llama", "tiny-deepseek-v2-moe", WIDE_MODEL)),
}


def build_wide_llama(path: Path) -> None:
    """A random Llama whose linear layers hold almost all its weights (bf16)."""
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
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path)


# The LM head and MoE routers stay unquantized, as llm-compressor's MoE recipes
# leave the routers.
IGNORE = ["lm_head", "re:.*mlp\\.gate$"]


def modifier(scheme: str | dict) -> QuantizationModifier:
    if isinstance(scheme, str):
        return QuantizationModifier(targets="Linear", scheme=scheme, ignore=IGNORE)
    group = {"targets": ["Linear"], **scheme}
    return QuantizationModifier(config_groups={"group_0": group}, ignore=IGNORE)


def calibration_data(vocab_size: int) -> Dataset:
    generator = torch.Generator().manual_seed(0)
    shape = (CALIBRATION_SAMPLES, CALIBRATION_LENGTH)
    ids = torch.randint(3, vocab_size, shape, generator=generator)
    return Dataset.from_dict(
        {"input_ids": ids.tolist(), "attention_mask": torch.ones(shape).tolist()}
    )


def dequantized_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each quantized weight as compressed-tensors rounds it, in float32."""
    weights = {}
    for name, module in model.named_modules():
        scheme = getattr(module, "quantization_scheme", None)
        if scheme is None or scheme.weights is None:
            continue
        scale = module.weight_scale.float()
        zero_point = getattr(module, "weight_zero_point", None)
        weight = module.weight.float()
        weights[f"{name}.weight"] = fake_quantize(
            weight, scale, zero_point, scheme.weights
        )
    return weights


def write_dequantized(source: Path, out: Path, deq: dict[str, torch.Tensor]) -> Path:
    """The source checkpoint with each quantized weight replaced, by its name on
    disk: llm-compressor names MoE experts one by one (``experts.E.gate_proj``)
    where transformers 5 holds them fused, so loading them into a transformers
    model would leave its experts unquantized."""
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("*.safetensors"))
    (out / STAMP_FILE).unlink(missing_ok=True)
    state = load_file(source / "model.safetensors")
    unknown = set(deq) - set(state)
    if unknown:
        raise ValueError(f"{source}: no weights named {sorted(unknown)[:3]} ...")
    state |= {name: w.to(state[name].dtype) for name, w in deq.items()}
    save_file(state, out / "model.safetensors")
    return out


def write(source: Path, out: Path, scheme: str | dict, reference: bool) -> None:
    """The compressed checkpoint at ``out``, and its dequantized twin if asked."""
    model = AutoModelForCausalLM.from_pretrained(source, dtype="auto")
    static = scheme == "FP8"
    data = calibration_data(model.config.vocab_size) if static else None
    oneshot(
        model=model,
        recipe=modifier(scheme),
        dataset=data,
        num_calibration_samples=CALIBRATION_SAMPLES,
        max_seq_length=CALIBRATION_LENGTH,
    )
    deq = dequantized_weights(model)
    model.save_pretrained(out, save_compressed=True)
    targets = [out]
    if reference:
        targets.append(write_dequantized(source, Path(f"{out}-dequantized"), deq))
    for tokenizer_file in source.glob("tokenizer*"):
        for target in targets:
            shutil.copy(tokenizer_file, target)


def is_current(path: Path) -> bool:
    stamp = path / STAMP_FILE
    return stamp.exists() and stamp.read_text() == BUILD_VERSION


def main(models_dir: Path) -> None:
    wide = models_dir / WIDE_MODEL
    if not is_current(wide):
        build_wide_llama(wide)
        (wide / STAMP_FILE).write_text(BUILD_VERSION)
    for name, (scheme, bases) in SCHEMES.items():
        for base in bases:
            out = models_dir / f"{base}-ct-{name}"
            if is_current(out):
                continue
            write(models_dir / base, out, scheme, reference=base != WIDE_MODEL)
            config = json.loads((out / "config.json").read_text())
            print(f"wrote {out.name}: {config['quantization_config']['format']}")
            (out / STAMP_FILE).write_text(BUILD_VERSION)


if __name__ == "__main__":
    if len(sys.argv) == 4:
        source, out, name = sys.argv[1:]
        write(Path(source), Path(out), SCHEMES[name][0], reference=False)
    else:
        main(Path(sys.argv[1]))
