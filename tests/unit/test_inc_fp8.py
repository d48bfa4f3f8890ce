"""Intel Neural Compressor's Gaudi FP8 path in emulation: the torch stand-ins for
Gaudi's fp8 ops against naive references, INC measuring and converting the
Gaudi-named attention modules, and the start-up checks of QUANT_CONFIG."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from vllm_hpu.attention.inc_modules import (
    Matmul,
    ModuleFusedSDPA,
    Softmax,
    VLLMKVCache,
)
from vllm_hpu.device import _CpuFusedSDPA
from vllm_hpu.quantization import inc_emulation as emulated
from vllm_hpu.quantization.inc import apply_fp8_options
from vllm_hpu.quantization.inc_config import HpuIncConfig
from vllm_hpu.quantization.inc_flow import enable_inc

FP8 = torch.float8_e4m3fn
MODULES = ("proj", "matmul_qk", "softmax", "matmul_av", "k_cache", "fused_sdpa")


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def test_casts_saturate_and_round_trip() -> None:
    x = torch.tensor([1000.0, -3.0, 0.5])
    q = emulated.cast_to_fp8(x, 0.5)
    assert q.dtype == FP8 and q.float().tolist() == [448.0, -1.5, 0.25]
    assert emulated.cast_from_fp8(q, 2.0, torch.float32).tolist() == [896.0, -3, 0.5]


def test_fp8_gemm_is_the_scaled_matmul_of_its_upcasts() -> None:
    a, b = torch.randn(5, 16).to(FP8), torch.randn(16, 3).to(FP8)
    got = emulated.fp8_gemm(
        a, b, out_dtype=torch.float32, scale_input_inv=0.5, scale_other_inv=4.0
    )
    torch.testing.assert_close(got, a.float() @ b.float() * 2.0)


def test_softmax_fp8_quantizes_the_probabilities() -> None:
    x = torch.randn(4, 10)
    got = emulated.softmax_fp8(x, -1, 1.0, 2.0)
    assert got.dtype == FP8
    want = torch.softmax(x, -1)
    torch.testing.assert_close(got.float() / 2.0, want, rtol=0.07, atol=1e-3)


@pytest.mark.parametrize("query_len", [7, emulated.SDPA_QUERY_CHUNK + 9])
def test_fused_sdpa_matches_torch_and_returns_the_softmax_amax(query_len) -> None:
    """Unquantized (as MEASURE calls it) in query chunks, grouped-query heads."""
    q = torch.randn(1, 4, query_len, 16)
    k, v = torch.randn(2, 1, 2, query_len, 16)
    mask = torch.full((query_len, query_len), -torch.inf).triu(1)[None, None]
    out, amax = emulated.fp8_fused_sdpa(q, k, v, mask, scale=0.25, is_amax_s=True)
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=0.25, enable_gqa=True
    )
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    assert amax is not None and float(amax) == 1.0  # the first row sees itself


class _GaudiPieces(torch.nn.Module):
    """A linear and the attention modules INC patches, wired as attention is."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(64, 64, bias=False)
        self.matmul_qk, self.softmax, self.matmul_av = Matmul(), Softmax(), Matmul()
        self.k_cache = VLLMKVCache()
        self.fused_sdpa = ModuleFusedSDPA(_CpuFusedSDPA)

    def forward(self, x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        self.k_cache(h.view(-1, 1, 64), cache, torch.arange(h.shape[0]))
        blocks = cache.unflatten(0, (-1, 4))
        k = self.k_cache.fetch_from_cache(blocks, torch.tensor([0, 1]))
        k = k.reshape(-1, 64).to(h.dtype)
        out = self.matmul_av(self.softmax(self.matmul_qk(h, k.t()), -1), k)
        q = out.view(1, 1, 8, 64)
        return out + self.fused_sdpa(q, q, q, None, 0.0, False, 0.125).view(8, 64)


def _inc_config(tmp_path: Path, mode: str, scale_method: str = "maxabs_hw") -> str:
    path = tmp_path / f"{mode}_{scale_method}.json"
    config = {
        "mode": mode,
        "observer": "maxabs",
        "scale_method": scale_method,
        "dump_stats_path": str(tmp_path / "inc_output"),
    }
    path.write_text(json.dumps(config))
    return str(path)


def _run(model: torch.nn.Module, x: torch.Tensor, cache_dtype: torch.dtype):
    return model(x, torch.zeros(16, 1, 64, dtype=cache_dtype))


def test_inc_measures_and_converts_the_gaudi_modules(tmp_path) -> None:
    from neural_compressor.torch.quantization import (
        FP8Config,
        convert,
        finalize_calibration,
        prepare,
    )

    enable_inc()
    torch.manual_seed(0)
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    reference = _GaudiPieces().bfloat16()
    want = _run(reference, x, torch.bfloat16)
    measured = prepare(
        _GaudiPieces().bfloat16(),
        FP8Config.from_json_file(_inc_config(tmp_path, "MEASURE")),
    )
    measured.load_state_dict(reference.state_dict())
    _run(measured, x, torch.bfloat16)
    finalize_calibration(measured)
    # INC adds "_<rank>_<world>" to the name once torch.distributed is up (an
    # in-process engine earlier in the session).
    (mod_list,) = tmp_path.glob("inc_output_hooks_maxabs*_mod_list.json")
    names = json.loads(mod_list.read_text())
    # INC's module list is process-wide: an engine measured earlier in the
    # session leaves its own modules in it.
    assert [name for name in names if name in MODULES] == list(MODULES)
    for scale_method, bound in (("maxabs_hw", 0.1), ("unit_scale", 0.3)):
        config = FP8Config.from_json_file(
            _inc_config(tmp_path, "QUANTIZE", scale_method)
        )
        quantized = _GaudiPieces().bfloat16()
        quantized.load_state_dict(reference.state_dict())
        converted = convert(quantized, config)
        _assert_patched_by_inc(converted)
        error = _relative_error(_run(converted, x, FP8).detach(), want.detach())
        # Quantized, so not bf16's output; within the bound of fp8's rounding.
        assert MIN_FP8_ERROR < error < bound, (scale_method, error)


# Below this relative error the output is bf16's: nothing was quantized.
MIN_FP8_ERROR = 1e-3
# INC's replacement for each piece of _GaudiPieces.
PATCHED = {
    "proj": "PatchedLinear",
    "matmul_qk": "PatchedMatmul",
    "softmax": "PatchedSoftmax",
    "matmul_av": "PatchedMatmul",
    "k_cache": "PatchedVLLMKVCache",
    "fused_sdpa": "PatchedModuleFusedSDPA",
}


def _assert_patched_by_inc(model: torch.nn.Module) -> None:
    """Each piece is INC's patched class; the linear's weight is stored in fp8."""
    for name, patched in PATCHED.items():
        module = getattr(model, name)
        assert type(module).__name__ == patched, (name, type(module))
        assert type(module).__module__.startswith("neural_compressor."), name
    assert model.proj.weight.dtype == FP8


def _vllm_config(cache_dtype="auto", quantization=None, dtype=torch.bfloat16):
    return SimpleNamespace(
        cache_config=SimpleNamespace(cache_dtype=cache_dtype),
        model_config=SimpleNamespace(quantization=quantization, dtype=dtype),
        quant_config=None,  # vLLM makes it from the method named before our hook
    )


def test_quant_config_alone_selects_the_inc_flow(tmp_path, hpu_env) -> None:
    hpu_env(QUANT_CONFIG=_inc_config(tmp_path, "MEASURE"))
    config = _vllm_config()
    apply_fp8_options(config)  # type: ignore[arg-type]
    assert config.model_config.quantization == "inc"
    # As vLLM makes it from the name: the engine core's second pass would.
    assert isinstance(config.quant_config, HpuIncConfig)


def test_unit_scale_needs_no_measurements(tmp_path, hpu_env) -> None:
    hpu_env(QUANT_CONFIG=_inc_config(tmp_path, "QUANTIZE", "unit_scale"))
    apply_fp8_options(_vllm_config("fp8", "inc"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("file", "config", "error"),
    [
        (None, _vllm_config("auto", "inc"), "--quantization inc needs QUANT_CONFIG"),
        ("missing.json", _vllm_config(), r"QUANT_CONFIG=.*missing.json: cannot read"),
        ("bad.json", _vllm_config(), r"QUANT_CONFIG=.*bad.json: not valid JSON"),
        ("mode.json", _vllm_config(), "mode 'CALIBRATE' is not supported"),
        ("quant.json", _vllm_config("fp8_inc"), "no measurement files .*inc_output"),
        ("quant.json", _vllm_config(), "quantizes the KV cache: pass --kv-cache"),
        ("measure.json", _vllm_config("fp8"), "MEASURE config: .*drop --kv-cache"),
        ("measure.json", _vllm_config(dtype=torch.float32), "--dtype bfloat16"),
        ("measure.json", _vllm_config("auto", "awq"), "cannot take a awq model"),
        ("dynamic.json", _vllm_config("fp8_inc"), "dynamic quantization .*Gaudi"),
    ],
)
def test_inc_options_refused_at_start_up(tmp_path, hpu_env, file, config, error):
    files = {
        "bad.json": "{mode: MEASURE",
        "mode.json": '{"mode": "CALIBRATE"}',
        "quant.json": json.dumps(
            {"mode": "QUANTIZE", "dump_stats_path": f"{tmp_path}/inc_output"}
        ),
        "measure.json": '{"mode": "MEASURE"}',
        "dynamic.json": '{"mode": "QUANTIZE", "dynamic_quantization": true, '
        '"scale_method": "unit_scale"}',
    }
    if file is not None:
        path = tmp_path / file
        if file in files:
            path.write_text(files[file])
        hpu_env(QUANT_CONFIG=str(path))
    with pytest.raises(ValueError, match=error):
        apply_fp8_options(config)  # type: ignore[arg-type]
