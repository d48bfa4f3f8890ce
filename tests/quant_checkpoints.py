"""A packer, written for the tests from the formats' published layouts, that turns
a local model into a 4-bit AutoAWQ- or GPTQ-format checkpoint, and beside it the
same model with the dequantized weights, the reference transformers runs on."""

import dataclasses
import json
import shutil
import zlib
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

# AutoAWQ writes logical value AWQ_ORDER[i] of each run of eight into nibble i.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
LINEAR_NAMES = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)


@dataclasses.dataclass(frozen=True)
class Scheme:
    method: str  # "awq" or "gptq"
    group_size: int = 128  # -1: one group over the whole input
    sym: bool = False
    desc_act: bool = False


@dataclasses.dataclass
class Quantized:
    """One linear layer's weight in 4 bits: values (in, out) in 0..15, per-group
    zeros and fp16 scales (groups, out), and each input row's group."""

    values: torch.Tensor
    zeros: torch.Tensor
    scales: torch.Tensor
    g_idx: torch.Tensor

    def dequantized(self) -> torch.Tensor:
        """The (out, in) float32 weight, as transformers stores it."""
        g = self.g_idx.long()
        w = (self.values - self.zeros[g]).float() * self.scales[g].float()
        return w.t().contiguous()


def group_index(rows: int, scheme: Scheme, seed: int) -> torch.Tensor:
    size = rows if scheme.group_size == -1 else scheme.group_size
    if not scheme.desc_act:
        return torch.arange(rows, dtype=torch.int32) // size
    # desc_act quantizes rows in another order: groups are runs of that order.
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(seed))
    g_idx = torch.empty(rows, dtype=torch.int32)
    g_idx[order] = torch.arange(rows, dtype=torch.int32) // size
    return g_idx


def quantize(weight: torch.Tensor, scheme: Scheme, seed: int = 0) -> Quantized:
    """Round-to-nearest 4-bit quantization of an (out, in) weight."""
    w = weight.t().float()
    g_idx = group_index(w.shape[0], scheme, seed)
    groups = int(g_idx.max()) + 1
    lo = torch.stack([w[g_idx == g].amin(0) for g in range(groups)]).clamp(max=0)
    hi = torch.stack([w[g_idx == g].amax(0) for g in range(groups)]).clamp(min=0)
    if scheme.sym:
        scales = (torch.maximum(-lo, hi) / 7).clamp(min=1e-6).half()
        zeros = torch.full_like(scales, 8, dtype=torch.int32)
    else:
        scales = ((hi - lo) / 15).clamp(min=1e-6).half()
        zeros = (-lo / scales.float()).round().clamp(0, 15).to(torch.int32)
    gl = g_idx.long()
    values = (w / scales.float()[gl]).round() + zeros[gl]
    return Quantized(values.clamp(0, 15).to(torch.int32), zeros, scales, g_idx)


def pack(
    values: torch.Tensor,
    dim: int,
    order: tuple[int, ...] | None = None,
    bits: int = 4,
) -> torch.Tensor:
    """32 // bits unsigned values per int32 along ``dim``: value order[i] of each
    run (default: value i) into bits i*bits and up."""
    per_word = 32 // bits
    v = values.movedim(dim, -1).long()
    v = v.reshape(*v.shape[:-1], -1, per_word)[..., list(order or range(per_word))]
    packed = (v << torch.arange(0, 32, bits)).sum(-1)
    packed = torch.where(packed >= 1 << 31, packed - (1 << 32), packed)
    return packed.to(torch.int32).movedim(-1, dim).contiguous()


def layer_tensors(q: Quantized, scheme: Scheme) -> dict[str, torch.Tensor]:
    """The tensors a checkpoint stores for one layer, by suffix."""
    if scheme.method == "awq":
        return {
            "qweight": pack(q.values, 1, AWQ_ORDER),
            "qzeros": pack(q.zeros, 1, AWQ_ORDER),
            "scales": q.scales,
        }
    # GPTQ's v1 format stores zero - 1 (four bits, so a zero of 0 reads 15).
    return {
        "qweight": pack(q.values, 0),
        "qzeros": pack((q.zeros - 1) & 0xF, 1),
        "scales": q.scales,
        "g_idx": q.g_idx,
    }


def quantization_config(scheme: Scheme) -> dict:
    if scheme.method == "awq":
        return {
            "quant_method": "awq",
            "bits": 4,
            "group_size": scheme.group_size,
            "zero_point": True,
            "version": "gemm",
        }
    return {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": scheme.group_size,
        "desc_act": scheme.desc_act,
        "sym": scheme.sym,
        "checkpoint_format": "gptq",
    }


def input_seed(module: str) -> int:
    """One seed for the layers that read the same input (q, k and v; gate and up):
    desc_act orders their rows alike, as GPTQ's shared Hessian does."""
    parent, proj = module.rsplit(".", 1)
    shared = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}
    return zlib.crc32(f"{parent}.{shared.get(proj, proj)}".encode())


def write_checkpoints(source: Path, out: Path, scheme: Scheme) -> tuple[Path, Path]:
    """(quantized, dequantized) model directories under ``out``."""
    quant_dir, deq_dir = out / "quantized", out / "dequantized"
    for d in (quant_dir, deq_dir):
        shutil.copytree(source, d, ignore=shutil.ignore_patterns("*.safetensors"))
    state = load_file(source / "model.safetensors")
    quant_state, deq_state = {}, {}
    for name, tensor in sorted(state.items()):
        module = name.removesuffix(".weight")
        if name == module or module.split(".")[-1] not in LINEAR_NAMES:
            quant_state[name] = deq_state[name] = tensor
            continue
        q = quantize(tensor, scheme, seed=input_seed(module))
        deq_state[name] = q.dequantized().to(tensor.dtype)
        for suffix, t in layer_tensors(q, scheme).items():
            quant_state[f"{module}.{suffix}"] = t
    save_file(quant_state, quant_dir / "model.safetensors")
    save_file(deq_state, deq_dir / "model.safetensors")
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = quantization_config(scheme)
    (quant_dir / "config.json").write_text(json.dumps(config, indent=1))
    return quant_dir, deq_dir
