"""gpt-oss's experts in OpenAI's own MXFP4 layout, as ``openai/gpt-oss-*`` ship
(quantization_config quant_method ``mxfp4``): build_tiny_models.py writes
tiny-gpt-oss-mxfp4 from tiny-gpt-oss's weights with this small quantizer.

The scale rule is the OCP Microscaling Formats (MX) v1.0 specification's
(section 6.3): a block of 32 values shares the exponent
X = floor(log2(amax)) - 2 (2: the largest e2m1 power, 6 = 1.5 * 2^2), stored
as the e8m0 byte X + 127; each value / 2^X rounds to the nearest e2m1 value,
ties to the even code, and magnitudes above 6 saturate to 6.

Layout (OpenAI's; transformers' ``convert_moe_packed_tensors`` reads it): each
expert projection W [E, out, in] (transformers holds its transpose) becomes
``*_blocks`` uint8 [E, out, in / 32, 16], two codes a byte, the low nibble
first, and ``*_scales`` uint8 [E, out, in / 32]; the biases are bf16, and every
other tensor is copied as it is.
"""

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

BLOCK = 32
E8M0_BIAS = 127
E2M1_EMAX = 2
# Midpoints between consecutive e2m1 magnitudes (0, 0.5, 1, 1.5, 2, 3, 4, 6).
E2M1_MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
SIGN = 8
# OpenAI's quantization_config for gpt-oss: everything but the experts in bf16.
QUANTIZATION_CONFIG = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
}
PROJECTIONS = ("gate_up_proj", "down_proj")


def e2m1_codes(values: torch.Tensor) -> torch.Tensor:
    """The nearest e2m1 code (sign bit 8, magnitude index 0-7) of each value,
    ties to the even code, saturating at 6."""
    magnitude = values.abs().contiguous()
    down = torch.bucketize(magnitude, E2M1_MIDPOINTS)  # a tie: the lower code
    up = torch.bucketize(magnitude, E2M1_MIDPOINTS, right=True)  # the higher
    codes = torch.where(down % 2 == 0, down, up)
    return torch.where(values < 0, codes | SIGN, codes).to(torch.uint8)


def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [..., in] (in a multiple of 32) -> (blocks [..., in / 32, 16] uint8,
    scales [..., in / 32] uint8), by the OCP MX rule above."""
    groups = weight.float().unflatten(-1, (-1, BLOCK))
    amax = groups.abs().amax(dim=-1)
    exponent = torch.floor(torch.log2(amax)) - E2M1_EMAX
    exponent = exponent.clamp(-E8M0_BIAS, E8M0_BIAS)  # amax 0: the smallest
    codes = e2m1_codes(groups / torch.exp2(exponent).unsqueeze(-1))
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    scales = (exponent + E8M0_BIAS).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous()


def quantize_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' gpt-oss state dict -> OpenAI's MXFP4 one."""
    out = {}
    for name, tensor in state.items():
        projection = name.rsplit(".", 1)[-1]
        if projection in PROJECTIONS:
            blocks, scales = quantize_mxfp4(tensor.transpose(1, 2))
            out[f"{name}_blocks"], out[f"{name}_scales"] = blocks, scales
        elif ".experts." in name and name.endswith("_bias"):
            out[name] = tensor.to(torch.bfloat16)
        else:
            out[name] = tensor
    return out


def write_gpt_oss_mxfp4(model_dir: Path) -> None:
    """Turn the gpt-oss checkpoint in ``model_dir`` into OpenAI's MXFP4 one."""
    weights = model_dir / "model.safetensors"
    save_file(quantize_experts(load_file(weights)), weights, {"format": "pt"})
    config_file = model_dir / "config.json"
    config = json.loads(config_file.read_text())
    config["quantization_config"] = QUANTIZATION_CONFIG
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
