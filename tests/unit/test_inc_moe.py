"""Intel Neural Compressor on routed experts in emulation: the torch stand-ins
for Gaudi's fused MoE op against a naive loop, and INC measuring and converting
the Gaudi-named expert modules (quantization/inc_moe.py)."""

import json
from pathlib import Path

import torch

from vllm_hpu.quantization import inc_emulation as emulated
from vllm_hpu.quantization.inc_flow import enable_inc
from vllm_hpu.quantization.inc_moe import VllmMixtureOfExpertsOp

FP8 = torch.float8_e4m3fn
NUM_TOKENS, HIDDEN, INTERMEDIATE, NUM_EXPERTS, TOP_K = 9, 32, 16, 4, 2


def _experts(dtype: torch.dtype = torch.float32):
    torch.manual_seed(0)
    w13 = torch.randn(NUM_EXPERTS, 2 * INTERMEDIATE, HIDDEN, dtype=dtype) * 0.2
    w2 = torch.randn(NUM_EXPERTS, HIDDEN, INTERMEDIATE, dtype=dtype) * 0.2
    x = torch.randn(NUM_TOKENS, HIDDEN, dtype=dtype)
    # Expert 3 is never chosen: its max-abs must stay 0.
    ids = torch.stack(
        [torch.arange(NUM_TOKENS) % 3, (torch.arange(NUM_TOKENS) + 1) % 3]
    )
    weights = torch.rand(NUM_TOKENS, TOP_K)
    return x, w13, w2, ids.t().contiguous(), weights


def _naive(x, w13, w2, ids, weights, rounding=lambda e, h: h):
    """Token by token, chosen expert by chosen expert."""
    out = torch.zeros(x.shape)
    amax = torch.zeros(NUM_EXPERTS)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            gate, up = (w13[e].float() @ x[t].float()).chunk(2)
            h = torch.nn.functional.silu(gate) * up
            amax[e] = max(amax[e], h.abs().max())
            out[t] += weights[t, k] * (w2[e].float() @ rounding(e, h))
    return out, amax


def test_moe_measurement_is_the_experts_output_and_their_intermediate_max() -> None:
    x, w13, w2, ids, weights = _experts()
    out, amax = emulated.moe_measurement(
        x, ids, weights, list(w13), list(w2), True, "silu", 0, NUM_EXPERTS - 1, True
    )
    want_out, want_amax = _naive(x, w13, w2, ids, weights)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(amax, want_amax)
    assert amax[3] == 0 and amax[:3].min() > 0


def test_fp8_moe_dequantizes_and_rounds_each_intermediate_with_its_scale() -> None:
    """Weights [in, out] (INC transposes them), per-expert scales: equal to the
    naive loop on the dequantized operands with the same fp8 rounding."""
    x, w13, w2, ids, weights = _experts()
    x_scale, w_scale = 0.02, 0.005
    inter_scales = [0.01, 0.02, 0.04, 0.08]
    qx = emulated.cast_to_fp8(x, 1 / x_scale)
    q13 = [emulated.cast_to_fp8(w.t(), 1 / w_scale) for w in w13]
    q2 = [emulated.cast_to_fp8(w.t(), 1 / w_scale) for w in w2]
    out = emulated.fp8_moe(
        qx, ids, weights, q13, q2, [w_scale] * 4, [w_scale] * 4, x_scale,
        inter_scales, permuted_weights=False, activation="silu",
    )  # fmt: skip

    def rounding(e: int, h: torch.Tensor) -> torch.Tensor:
        scale = inter_scales[e]
        return (h / scale).clamp(-448, 448).to(FP8).float() * scale

    want, _ = _naive(
        qx.float() * x_scale,
        torch.stack([q.float().t() * w_scale for q in q13]),
        torch.stack([q.float().t() * w_scale for q in q2]),
        ids,
        weights,
        rounding,
    )
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), want, rtol=1e-2, atol=1e-2)
    unrounded, _ = _naive(x, w13, w2, ids, weights)
    assert not torch.allclose(out.float(), unrounded, atol=1e-3)


class _MoeLayer(torch.nn.Module):
    def __init__(self, w13: torch.Tensor, w2: torch.Tensor) -> None:
        super().__init__()
        self.moe_op = VllmMixtureOfExpertsOp(w13, w2)

    def forward(self, x, ids, weights):  # type: ignore[no-untyped-def]
        return self.moe_op(x, ids, weights, True, "silu")


def _config(tmp_path: Path, mode: str) -> str:
    path = tmp_path / f"{mode}.json"
    dump = str(tmp_path / "moe")
    path.write_text(json.dumps({"mode": mode, "dump_stats_path": dump}))
    return str(path)


def test_inc_measures_each_expert_and_converts_them_to_fp8(tmp_path) -> None:
    from neural_compressor.torch.quantization import (
        FP8Config,
        convert,
        finalize_calibration,
        prepare,
    )

    enable_inc()
    x, w13, w2, ids, weights = _experts(torch.bfloat16)
    want = _MoeLayer(w13, w2)(x, ids, weights)
    measured = prepare(
        _MoeLayer(w13, w2), FP8Config.from_json_file(_config(tmp_path, "MEASURE"))
    )
    torch.testing.assert_close(measured(x, ids, weights), want, rtol=2e-2, atol=2e-2)
    finalize_calibration(measured)
    # "_<rank>_<world>" joins the name once torch.distributed is up.
    (stats,) = set(tmp_path.glob("moe_hooks_maxabs*.json")) - set(
        tmp_path.glob("*_mod_list.json")
    )
    nodes = json.loads(stats.read_text())["Nodes"]
    experts = {
        f"moe_op.{p}_list.{e}" for p in ("w13", "w2") for e in range(NUM_EXPERTS)
    }
    assert experts | {"moe_op"} <= set(nodes)
    assert len(nodes["moe_op"]["outputs"]) == 1 + NUM_EXPERTS

    quantized = convert(
        _MoeLayer(w13, w2), FP8Config.from_json_file(_config(tmp_path, "QUANTIZE"))
    )
    moe_op = quantized.moe_op
    assert type(moe_op).__name__ == "PatchedVllmMixtureOfExpertsOp"
    for expert in [*moe_op.w13_list, *moe_op.w2_list]:
        assert type(expert).__name__ == "PatchedMoeMatmul"
        assert expert.weight.dtype == FP8
    got = quantized(x, ids, weights)
    error = float((got.float() - want.float()).norm() / want.float().norm())
    print(f"INC fp8 experts, relative error against bf16: {error:.4f}")
    assert 0 < error < 0.1
