"""The online FP8 linear: per-tensor casts and the upcast matmul against float64."""

import pytest
import torch

from vllm_hpu.quantization.fp8 import (
    FP8_DTYPE,
    FP8_MAX,
    fp8_linear,
    quantize_per_tensor,
)


def test_quantize_per_tensor_maps_the_largest_magnitude_to_fp8_max():
    t = torch.randn(64, 32) * 3
    q, scale = quantize_per_tensor(t)
    assert q.dtype == FP8_DTYPE
    assert q.float().abs().max() == FP8_MAX
    # e4m3 keeps 3 mantissa bits: every value within 2^-4 of its magnitude.
    torch.testing.assert_close(q.float() * scale, t, rtol=2**-4, atol=scale * 2**-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_linear_matches_float64_on_the_same_fp8_values(dtype):
    x, w, bias = torch.randn(5, 64), torch.randn(48, 64), torch.randn(48)
    wq, w_scale = quantize_per_tensor(w)
    xq, x_scale = quantize_per_tensor(x.to(dtype))
    expected = (xq.double() * x_scale) @ (wq.double() * w_scale).t() + bias.double()
    actual = fp8_linear(x.to(dtype), wq, w_scale, bias.to(dtype))
    assert actual.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(actual.double(), expected, rtol=tol, atol=tol * 8)


def test_fp8_linear_is_close_to_the_unquantized_linear():
    x, w = torch.randn(7, 256), torch.randn(128, 256)
    wq, w_scale = quantize_per_tensor(w)
    out, ref = fp8_linear(x, wq, w_scale), x @ w.t()
    assert (out - ref).norm() <= 0.05 * ref.norm()
