"""A packer, written for the tests from the formats' published layouts, that turns
a local model into a 4-bit AutoAWQ- or GPTQ-format checkpoint, and beside it the
same model with the dequantized weights, the reference transformers runs on."""

import dataclasses
import json
import shutil
import zlib
from collections.abc import Callable
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
    # Multi-head latent attention (DeepSeek-V2/V3)
    "q_a_proj",
    "q_b_proj",
    "kv_a_proj_with_mqa",
    "kv_b_proj",
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


LayerWriter = Callable[
    [str, torch.Tensor], tuple[dict[str, torch.Tensor], torch.Tensor]
]


def write_checkpoints(
    source: Path, out: Path, scheme: "Scheme | Fp8Scheme"
) -> tuple[Path, Path]:
    """(quantized, dequantized) model directories under ``out``."""
    if isinstance(scheme, Fp8Scheme):
        return _write(source, out, fp8_layer_writer(source, scheme), fp8_config(scheme))

    def int4_layer(module: str, weight: torch.Tensor):
        q = quantize(weight, scheme, seed=input_seed(module))
        return layer_tensors(q, scheme), q.dequantized()

    return _write(source, out, int4_layer, quantization_config(scheme))


def _write(
    source: Path, out: Path, write_layer: LayerWriter, quant_config: dict
) -> tuple[Path, Path]:
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
        tensors, dequantized = write_layer(module, tensor)
        deq_state[name] = dequantized.to(tensor.dtype)
        for suffix, t in tensors.items():
            quant_state[f"{module}.{suffix}"] = t
    save_file(quant_state, quant_dir / "model.safetensors")
    save_file(deq_state, deq_dir / "model.safetensors")
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = quant_config
    (quant_dir / "config.json").write_text(json.dumps(config, indent=1))
    return quant_dir, deq_dir


# -- fp8 checkpoints as vLLM's ``fp8`` method reads them (DeepSeek-V3's layout) --
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max


@dataclasses.dataclass(frozen=True)
class Fp8Scheme:
    block_size: tuple[int, int] | None = (128, 128)  # None: one scale per tensor
    activation_scheme: str = "dynamic"  # "static": input scales from calibration


def fp8_config(scheme: Fp8Scheme) -> dict:
    config = {"quant_method": "fp8", "fmt": "e4m3"}
    config["activation_scheme"] = scheme.activation_scheme
    if scheme.block_size is not None:
        config["weight_block_size"] = list(scheme.block_size)
    return config


def quantize_fp8(
    weight: torch.Tensor, block_size: tuple[int, int] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 weight, scale) with weight ~= fp8 * scale per block (DeepSeek's
    ``weight_scale_inv`` [ceil(N/bn), ceil(K/bk)], partial edge blocks) or per
    tensor; each block's largest magnitude maps to fp8's largest value."""
    w = weight.float()
    n, k = w.shape
    bn, bk = block_size or (n, k)
    rows, cols = -(-n // bn), -(-k // bk)
    padded = torch.zeros(rows * bn, cols * bk)
    padded[:n, :k] = w
    blocks = padded.view(rows, bn, cols, bk)
    scale = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp(min=1e-12)
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    q = q.view(rows * bn, cols * bk)[:n, :k].contiguous()
    return q, scale if block_size else scale.reshape(())


def dequantize_fp8_reference(
    q: torch.Tensor, scale: torch.Tensor, block_size: tuple[int, int] | None
) -> torch.Tensor:
    """Each weight times its block's scale, looked up element by element."""
    n, k = q.shape
    bn, bk = block_size or (n, k)
    grid = scale.reshape(-(-n // bn), -(-k // bk))
    rows = (torch.arange(n) // bn)[:, None]
    cols = (torch.arange(k) // bk)[None, :]
    return q.float() * grid[rows, cols]


def fp8_layer_writer(source: Path, scheme: Fp8Scheme) -> LayerWriter:
    input_scales = (
        calibrate_input_scales(source) if scheme.activation_scheme == "static" else {}
    )

    def write_layer(module: str, weight: torch.Tensor):
        q, scale = quantize_fp8(weight, scheme.block_size)
        name = "weight_scale_inv" if scheme.block_size else "weight_scale"
        tensors = {"weight": q, name: scale}
        if module in input_scales:
            tensors["input_scale"] = input_scales[module]
        return tensors, dequantize_fp8_reference(q, scale, scheme.block_size)

    return write_layer


@torch.no_grad()
def calibrate_input_scales(source: Path, seed: int = 0) -> dict[str, torch.Tensor]:
    """Static fp8 input scales of each linear layer: the largest input magnitude
    seen on a random prompt, mapped to fp8's largest value."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    amax: dict[str, torch.Tensor] = {}

    def record(name: str):
        def hook(module: torch.nn.Module, args: tuple) -> None:
            amax[name] = torch.maximum(
                amax.get(name, torch.tensor(0.0)), args[0].abs().max()
            )

        return hook

    for name, module in model.named_modules():
        if name.split(".")[-1] in LINEAR_NAMES:
            module.register_forward_pre_hook(record(name))
    generator = torch.Generator().manual_seed(seed)
    model(torch.randint(3, model.config.vocab_size, (1, 64), generator=generator))
    return {name: (a / FP8_MAX).reshape(1) for name, a in amax.items()}


# -- activations quantized as the plugin quantizes them, for the reference ------
Quantizer = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]
_FP8_MIN_SCALE = 1.0 / (FP8_MAX * 512.0)  # vLLM's QuantFP8 floor


def _fp8_round_trip(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    q = (x.float() * scale.reciprocal()).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return (q.float() * scale).to(x.dtype)


def fp8_per_token(x: torch.Tensor, input_scale: torch.Tensor | None) -> torch.Tensor:
    scale = (x.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp(
        min=_FP8_MIN_SCALE
    )
    return _fp8_round_trip(x, scale)


def fp8_per_tensor_dynamic(
    x: torch.Tensor, input_scale: torch.Tensor | None
) -> torch.Tensor:
    """One scale for the whole input, from its largest value."""
    scale = (x.abs().amax().float() / FP8_MAX).clamp(min=_FP8_MIN_SCALE)
    return _fp8_round_trip(x, scale)


def fp8_static(x: torch.Tensor, input_scale: torch.Tensor | None) -> torch.Tensor:
    assert input_scale is not None
    return _fp8_round_trip(x, input_scale.float())


def fp8_groups(group_size: int, fp8_max: float = FP8_MAX) -> Quantizer:
    """Per token and group of ``group_size``, scaled to ``fp8_max`` (e4m3's 448;
    a card with a smaller range quantizes to its own, vLLM's floor with it)."""
    min_scale = 1.0 / (fp8_max * 512.0)

    def quantize(x: torch.Tensor, input_scale: torch.Tensor | None) -> torch.Tensor:
        groups = x.float().unflatten(-1, (-1, group_size))
        scale = (groups.abs().amax(-1, keepdim=True) / fp8_max).clamp(min=min_scale)
        q = (groups / scale).clamp(-fp8_max, fp8_max).to(FP8_DTYPE)
        return (q.float() * scale).flatten(-2).to(x.dtype)

    return quantize


def int8_per_token(x: torch.Tensor, input_scale: torch.Tensor | None) -> torch.Tensor:
    scale = x.abs().amax(dim=-1, keepdim=True).float() / 127
    scale = torch.where(scale == 0, 1.0, scale)
    return (torch.round(x.float() / scale).clamp(-128, 127) * scale).to(x.dtype)


def input_quantizer(quant_config: dict) -> Quantizer | None:
    """How a checkpoint declares its linear layers' inputs quantized (None where
    they stay as they are): ``fp8``'s dynamic activations with per-tensor
    weights one scale per tensor (the plugin refines them per token, as vLLM
    does with CUTLASS: tests compare with a stated tolerance), with block
    weights per token and group; compressed-tensors' as its strategy says."""
    if quant_config["quant_method"] == "fp8":
        block = quant_config.get("weight_block_size")
        if block:
            return fp8_groups(block[0])
        if quant_config["activation_scheme"] == "static":
            return fp8_static
        return fp8_per_tensor_dynamic
    (group,) = quant_config["config_groups"].values()
    args = group["input_activations"]
    if args is None:
        return None
    if args["type"] == "int":
        assert args["strategy"] == "token", args  # the only int8 scheme tested
        return int8_per_token
    if args["strategy"] == "group":
        return fp8_groups(args["group_size"])
    if args["strategy"] == "token":
        return fp8_per_token
    return fp8_static if not args["dynamic"] else fp8_per_tensor_dynamic


def quantize_inputs(
    model: torch.nn.Module, quantizer: Quantizer, input_scales: dict[str, torch.Tensor]
) -> None:
    """Quantize and dequantize the input of each quantized linear layer."""

    def hook(name: str):
        def quantize(module: torch.nn.Module, args: tuple) -> tuple:
            return (quantizer(args[0], input_scales.get(name)), *args[1:])

        return quantize

    for name, module in model.named_modules():
        if name.split(".")[-1] in LINEAR_NAMES:
            module.register_forward_pre_hook(hook(name))


# -- MXFP4 (e2m1 codes with e8m0 scales), for tests of its kernels ---------------
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [..., K/2] uint8, low nibble first; scales [..., K/32] uint8
    e8m0), as the OCP MX spec scales: each group of 32 divided by 2 ** (floor(
    log2(its largest magnitude)) - 2), then rounded to the nearest e2m1 value
    (magnitudes past 6 to 6)."""
    groups = weight.float().unflatten(-1, (-1, 32))
    amax = groups.abs().amax(-1, keepdim=True).clamp(min=2.0**-126)
    exponent = torch.floor(torch.log2(amax)) - 2
    scaled = groups / torch.exp2(exponent)
    index = (scaled.abs().unsqueeze(-1) - E2M1).abs().argmin(-1)
    codes = (index | (scaled < 0).long() << 3).flatten(-2)
    packed = (codes[..., 0::2] | codes[..., 1::2] << 4).to(torch.uint8)
    return packed, (exponent.squeeze(-1) + 127).to(torch.uint8)
