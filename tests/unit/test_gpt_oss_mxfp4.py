"""gpt-oss's own MXFP4 experts without an engine: the set-up's quantizer
(scripts/tiny_mxfp4.py) rounds as the OCP MX rule says, transformers' own
dequantizer (the format's reference reader) and the plugin's read its blocks
back to the values it meant, and the plugin's method runs them in groups with
their biases and the clamped SwiGLU."""

import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from vllm_hpu.ops import fused_moe
from vllm_hpu.ops.activations import SWIGLUOAI, swiglu_oai
from vllm_hpu.quantization.dequant import E2M1_VALUES, dequantize_mxfp4
from vllm_hpu.quantization.packed_moe import HpuGptOssMxfp4MoEMethod

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from tiny_mxfp4 import quantize_mxfp4

EXPERTS, HIDDEN, INTERMEDIATE, TOKENS, TOP_K = 4, 64, 32, 5, 2
ALPHA, LIMIT = 1.702, 7.0


def test_quantizer_rounds_to_nearest_ties_to_even_and_saturates():
    # amax 7.9: X = floor(log2 7.9) - 2 = 0, so the values round as they are.
    row = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.3, -2.9, 7.9, -0.1]
    want = [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 0.5, -3.0, 6.0, -0.0]
    weight = torch.tensor(row + [0.0] * 20).reshape(1, 32)
    blocks, scales = quantize_mxfp4(weight)
    assert scales.tolist() == [[127]]
    assert blocks.shape == (1, 1, 16)
    values = dequantize_mxfp4(blocks, scales)[0, : len(want)]
    assert values.tolist() == want
    # Four times the block: amax 31.6, X = 2, the same codes.
    blocks4, scales4 = quantize_mxfp4(weight * 4)
    assert scales4.tolist() == [[129]] and torch.equal(blocks4, blocks)


def exact_weights(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Values that MXFP4 holds exactly and whose blocks each reach ±4 or ±6
    times their power of two, so that the OCP rule finds that power again."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, shape, generator=gen)
    codes[..., ::32] = 7  # 6.0 (the block's amax: X = its exponent)
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES))
    exponents = torch.randint(-6, 3, (*shape[:-1], shape[-1] // 32), generator=gen)
    return table[codes] * torch.exp2(exponents.float()).repeat_interleave(32, -1)


def test_transformers_reads_the_blocks_as_the_quantizer_meant():
    """OpenAI's layout: transformers' gate_up_proj [E, H, 2I] is stored as
    ``*_blocks`` [E, 2I, H / 32, 16]; its dequantizer transposes back."""
    gate_up = exact_weights((EXPERTS, 2 * INTERMEDIATE, HIDDEN), seed=0)
    blocks, scales = quantize_mxfp4(gate_up)
    assert blocks.shape == (EXPERTS, 2 * INTERMEDIATE, HIDDEN // 32, 16)
    read = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    assert torch.equal(read, gate_up.transpose(1, 2))
    assert torch.equal(dequantize_mxfp4(blocks, scales), gate_up)


def gpt_oss_layer(seed: int) -> SimpleNamespace:
    """A layer as vLLM's gpt-oss loader leaves it: blocks flattened to
    [E, N, K / 2], e8m0 scales, bf16 biases."""
    gen = torch.Generator().manual_seed(seed)
    w13 = exact_weights((EXPERTS, 2 * INTERMEDIATE, HIDDEN), seed) / 8
    w2 = exact_weights((EXPERTS, HIDDEN, INTERMEDIATE), seed + 1) / 8
    layer = SimpleNamespace(
        local_num_experts=EXPERTS,
        hidden_size=HIDDEN,
        intermediate_size_per_partition=INTERMEDIATE,
        activation=SimpleNamespace(value=SWIGLUOAI),
        swiglu_alpha=ALPHA,
        swiglu_limit=LIMIT,
        w13_bias=torch.randn(EXPERTS, 2 * INTERMEDIATE, generator=gen).bfloat16(),
        w2_bias=torch.randn(EXPERTS, HIDDEN, generator=gen).bfloat16(),
    )
    for name, weight in (("w13", w13), ("w2", w2)):
        blocks, scales = quantize_mxfp4(weight)
        setattr(layer, f"{name}_weight", blocks.flatten(-2))
        setattr(layer, f"{name}_weight_scale", scales)
    return layer


def naive_experts(layer, x, weights, ids):  # type: ignore[no-untyped-def]
    """Token by token: sum over k of w_k * (W2 swiglu(W13 x + b13) + b2)."""
    w13 = dequantize_mxfp4(layer.w13_weight, layer.w13_weight_scale)
    w2 = dequantize_mxfp4(layer.w2_weight, layer.w2_weight_scale)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            h = swiglu_oai(w13[e] @ x[t] + layer.w13_bias[e].float(), ALPHA, LIMIT)
            out[t] += weights[t, k] * (w2[e] @ h + layer.w2_bias[e].float())
    return out


def test_method_runs_groups_of_experts_with_their_biases(monkeypatch):
    layer = gpt_oss_layer(seed=3)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(TOKENS, HIDDEN, generator=gen) * 2
    ids = torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOP_K] for _ in x])
    weights = torch.rand(TOKENS, TOP_K, generator=gen)
    # One expert a group: each group adds its own experts' biases only.
    one_expert = 3 * HIDDEN * INTERMEDIATE * 4  # float32 bytes
    monkeypatch.setattr(fused_moe, "EXPERT_GROUP_BYTES", one_expert)
    method = HpuGptOssMxfp4MoEMethod.__new__(HpuGptOssMxfp4MoEMethod)
    out = method.run_experts(layer, x, weights, ids)
    want = naive_experts(layer, x, weights, ids)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-4)
