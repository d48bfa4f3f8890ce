"""fp8 casts and matmul: hpu::cast_to_fp8_v2, hpu::cast_from_fp8 and
hpu::fp8_gemm_v2, each with its .scalar and .scalar_list overloads (bridge
v1.19.0 habana_eager/eager_custom_op_register.cpp:2146-2171).

cast_to_fp8_v2 multiplies by ``scale`` (INC passes the inverse of its scale,
fp_utils.py:26) and saturates at the card's largest fp8 value (240 for e4m3 on
Gaudi2); cast_from_fp8 multiplies by ``scale``. fp8_gemm_v2 computes
op(A) * A_scale_inv @ op(B) * B_scale_inv (+ bias, + D when accumulating), with
A_scale_inv per tensor or per row ([M, 1]) and B_scale_inv per tensor or per
output column ([N] as the bridge's tests, or [1, N] as vllm-gaudi passes):
another shape is refused rather than broadcast along an axis the kernel does
not scale.
"""

from typing import Any

import torch

from habana_frameworks.torch._double.ops import (
    define,
    fp8_values,
    host,
    to_device,
    to_fp8,
)

_CAST_TO = (
    "(Tensor input, {scale}, bool stochastic_rounding=False, bool is_amax=False, "
    "ScalarType dtype=None, int[]? scale_shape=None) -> (Tensor, Tensor)"
)
_CAST_FROM = (
    "(Tensor input, {scale}, ScalarType out_dtype, int[]? scale_shape=None) -> Tensor"
)
_GEMM = (
    "(Tensor A, bool trans_A, Tensor B, bool trans_B, Tensor? D, ScalarType out_dtype, "
    "{scales}, Tensor? bias=None, bool accumulate=False, "
    "int[]? B_scale_shape=None) -> Tensor"
)
SCALE_KINDS = {
    "": (
        "Tensor? scale=None",
        "Tensor? scale",
        "Tensor? A_scale_inv=None, Tensor? B_scale_inv=None",
    ),
    ".scalar": ("float scale", "float scale", "float A_scale_inv, float B_scale_inv"),
    ".scalar_list": (
        "float[] scale",
        "float[] scale",
        "float[] A_scale_inv, float[] B_scale_inv",
    ),
}


def _scale_tensor(scale: Any) -> torch.Tensor | None:
    if scale is None:
        return None
    if isinstance(scale, torch.Tensor):
        return host(scale).float()
    return torch.tensor(scale, dtype=torch.float32)


def cast_to_fp8_v2(
    input: torch.Tensor,
    scale: Any = None,
    stochastic_rounding: bool = False,
    is_amax: bool = False,
    dtype: torch.dtype | None = None,
    scale_shape: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    values = host(input).float()
    multiplier = _scale_tensor(scale)
    if multiplier is not None:
        values = values * (
            multiplier.reshape(scale_shape) if scale_shape else multiplier
        )
    out = to_fp8(values, dtype or torch.float8_e4m3fn)
    amax = host(input).abs().amax().float() if is_amax else torch.empty(0)
    return to_device(out), to_device(amax)


def cast_from_fp8(
    input: torch.Tensor,
    scale: Any,
    out_dtype: torch.dtype,
    scale_shape: list[int] | None = None,
) -> torch.Tensor:
    values = fp8_values(host(input))
    multiplier = _scale_tensor(scale)
    if multiplier is not None:
        values = values * (
            multiplier.reshape(scale_shape) if scale_shape else multiplier
        )
    return to_device(values.to(out_dtype))


def _row_scale(scale: torch.Tensor | None, rows: int) -> torch.Tensor | None:
    if scale is None or scale.numel() == 1:
        return None if scale is None else scale.reshape(())
    if scale.shape[-2:] == (rows, 1):
        return scale
    raise RuntimeError(
        f"fp8_gemm_v2: A_scale_inv of shape {list(scale.shape)} is neither per "
        f"tensor nor per row [{rows}, 1]"
    )


def _column_scale(scale: torch.Tensor | None, columns: int) -> torch.Tensor | None:
    if scale is None or scale.numel() == 1:
        return None if scale is None else scale.reshape(())
    if tuple(scale.shape) in ((columns,), (1, columns)):
        return scale.reshape(columns)
    raise RuntimeError(
        f"fp8_gemm_v2: B_scale_inv of shape {list(scale.shape)} is neither per tensor "
        f"nor per output column ([{columns}] or [1, {columns}])"
    )


def fp8_gemm_v2(
    A: torch.Tensor,
    trans_A: bool,
    B: torch.Tensor,
    trans_B: bool,
    D: torch.Tensor | None,
    out_dtype: torch.dtype,
    A_scale_inv: Any = None,
    B_scale_inv: Any = None,
    bias: torch.Tensor | None = None,
    accumulate: bool = False,
    B_scale_shape: list[int] | None = None,
) -> torch.Tensor:
    if B_scale_shape is not None:
        raise RuntimeError("HPU double: fp8_gemm_v2 with B_scale_shape is not modeled")
    a = fp8_values(host(A))
    b = fp8_values(host(B))
    a = a.transpose(-1, -2) if trans_A else a
    b = b.transpose(-1, -2) if trans_B else b
    a_scale = _row_scale(_scale_tensor(A_scale_inv), a.shape[-2])
    b_scale = _column_scale(_scale_tensor(B_scale_inv), b.shape[-1])
    out = torch.matmul(a if a_scale is None else a * a_scale, b)
    out = out if b_scale is None else out * b_scale
    if bias is not None:
        out = out + host(bias).float()
    if accumulate and D is not None:
        out = out + host(D).float()
    return to_device(out.to(out_dtype))


def _fake_cast_to(
    input: torch.Tensor, *args: Any, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = (
        kwargs.get("dtype")
        or (args[3] if len(args) > 3 else None)
        or torch.float8_e4m3fn
    )
    return torch.empty_like(input, dtype=dtype), input.new_empty(0, dtype=torch.float32)


def _fake_cast_from(
    input: torch.Tensor, scale: Any, out_dtype: torch.dtype, *args: Any
) -> torch.Tensor:
    return torch.empty_like(input, dtype=out_dtype)


def _fake_gemm(
    A: torch.Tensor,
    trans_A: bool,
    B: torch.Tensor,
    trans_B: bool,
    D: Any,
    out_dtype: torch.dtype,
    *args: Any,
    **kwargs: Any,
) -> torch.Tensor:
    rows = A.shape[-1] if trans_A else A.shape[-2]
    columns = B.shape[-2] if trans_B else B.shape[-1]
    return A.new_empty((*A.shape[:-2], rows, columns), dtype=out_dtype)


def register() -> None:
    for overload, (to_scale, from_scale, gemm_scales) in SCALE_KINDS.items():
        define(
            f"cast_to_fp8_v2{overload}" + _CAST_TO.format(scale=to_scale),
            cast_to_fp8_v2,
            _fake_cast_to,
        )
        define(
            f"cast_from_fp8{overload}" + _CAST_FROM.format(scale=from_scale),
            cast_from_fp8,
            _fake_cast_from,
        )
        define(
            f"fp8_gemm_v2{overload}" + _GEMM.format(scales=gemm_scales),
            fp8_gemm_v2,
            _fake_gemm,
        )
