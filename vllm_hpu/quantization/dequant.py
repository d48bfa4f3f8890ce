"""Dequantization of the weight layouts checkpoints ship (fp8, int8, packed 4- and
8-bit, MXFP4), in plain torch, on any leading dimensions (``[E, ...]`` for a
stack of experts), without reading vLLM."""

import torch

PACK_BITS = 32  # packed values live in int32 words
_NIBBLE = 4
# AutoAWQ stores logical value order_map[i] = [0, 2, 4, 6, 1, 3, 5, 7][i] in nibble i;
# logical value j therefore sits in nibble AWQ_NIBBLE_OF[j].
AWQ_NIBBLE_OF = (0, 4, 1, 5, 2, 6, 3, 7)
SYMMETRIC_GPTQ_ZERO = 8  # the zero point of symmetric 4-bit GPTQ (uint4 with bias 8)

MXFP4_GROUP_SIZE = 32  # values sharing one e8m0 scale
E8M0_BIAS = 127
# e2m1 magnitudes by their three low bits; bit 3 is the sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def pack_factor(num_bits: int) -> int:
    """How many ``num_bits`` values one int32 holds."""
    return PACK_BITS // num_bits


def unpack_int32(
    packed: torch.Tensor, num_bits: int, dim: int, awq_order: bool = False
) -> torch.Tensor:
    """Unsigned ``num_bits`` values of an int32 tensor along ``dim`` (grows by
    ``pack_factor``), value i at bit i*num_bits; ``awq_order``: AutoAWQ's nibbles."""
    shifts = torch.arange(0, PACK_BITS, num_bits, dtype=torch.int32)
    if awq_order:
        if num_bits != _NIBBLE:
            raise ValueError(f"AutoAWQ's nibble order is for 4 bits, not {num_bits}")
        shifts = shifts[list(AWQ_NIBBLE_OF)]
    moved = packed.movedim(dim, -1)
    values = (moved.unsqueeze(-1) >> shifts.to(packed.device)) & ((1 << num_bits) - 1)
    return values.flatten(-2).movedim(-1, dim)


def dequantize_groups(
    values: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    g_idx: torch.Tensor,
    dim: int,
) -> torch.Tensor:
    """(values - zero) * scale per input group, in the scales' dtype: ``scales``/
    ``zeros`` (None: 0) have ``groups`` along ``dim``; ``g_idx`` [(E,) inputs]."""
    shape = [1] * values.ndim
    shape[: g_idx.ndim - 1] = g_idx.shape[:-1]
    shape[dim] = g_idx.shape[-1]
    index = g_idx.long().reshape(shape)
    centred = values
    if zeros is not None:
        centred = values - torch.take_along_dim(zeros, index, dim)
    return centred.to(scales.dtype) * torch.take_along_dim(scales, index, dim)


def dequantize_contiguous(
    values: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | int | None,
    dim: int,
) -> torch.Tensor:
    """:func:`dequantize_groups` for groups of consecutive inputs, broadcasting each
    group's zero (int: one for all) and scale over its run without a gather."""
    dim = dim % values.ndim
    grouped = values.unflatten(dim, (scales.shape[dim], -1))
    if isinstance(zeros, torch.Tensor):
        grouped = grouped - zeros.unsqueeze(dim + 1)
    elif zeros is not None:
        grouped = grouped - zeros
    weight = grouped.to(scales.dtype) * scales.unsqueeze(dim + 1)
    return weight.flatten(dim, dim + 1)


def dequantize_awq(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor
) -> torch.Tensor:
    """AutoAWQ GEMM: qweight ``[..., K, N/8]``, qzeros ``[..., G, N/8]`` (AWQ nibble
    order), scales ``[..., G, N]`` -> weight ``[..., K, N]`` in the scales' dtype."""
    values = unpack_int32(qweight, _NIBBLE, dim=-1, awq_order=True)
    zeros = unpack_int32(qzeros, _NIBBLE, dim=-1, awq_order=True)
    return dequantize_contiguous(values, scales, zeros, dim=-2)


def dequantize_gptq(
    qweight: torch.Tensor,
    qzeros: torch.Tensor | None,
    scales: torch.Tensor,
    g_idx: torch.Tensor | None,
    v1: bool = True,
) -> torch.Tensor:
    """GPTQ's layout: 4-bit qweight ``[..., K/8, N]``, qzeros ``[..., G, N/8]`` (None:
    symmetric; v1 stores zero - 1, gptq_v2 the zero), scales ``[..., G, N]``, g_idx
    ``[K]`` with desc_act (None: consecutive groups); the weight ``[..., K, N]``."""
    values = unpack_int32(qweight, _NIBBLE, dim=-2)
    zeros: torch.Tensor | int = SYMMETRIC_GPTQ_ZERO
    if qzeros is not None:
        zeros = unpack_int32(qzeros, _NIBBLE, dim=-1)
        # v1 stores zero - 1 in four bits: a zero of 0 was written as 15.
        zeros = (zeros + 1) & 0xF if v1 else zeros
    if g_idx is None:
        return dequantize_contiguous(values, scales, zeros, dim=-2)
    if isinstance(zeros, int):
        zeros = torch.full_like(scales, zeros, dtype=torch.int32)
    return dequantize_groups(values, scales, zeros, g_idx, dim=-2)


def dequantize_pack_quantized(
    weight_packed: torch.Tensor,
    weight_scale: torch.Tensor,
    num_bits: int,
    weight_zero_point: torch.Tensor | None = None,
    g_idx: torch.Tensor | None = None,
) -> torch.Tensor:
    """compressed-tensors' ``pack-quantized``: values offset by 2**(num_bits-1),
    weight_packed ``[..., N, K/pack]``, weight_scale ``[..., N, G]``,
    weight_zero_point ``[..., N/pack, G]`` (None: symmetric), g_idx ``[K]`` (None:
    consecutive); the weight ``[..., N, K]`` in the scale's dtype."""
    values = unpack_int32(weight_packed, num_bits, dim=-1)
    zeros = None
    if weight_zero_point is not None:
        zeros = unpack_int32(weight_zero_point, num_bits, dim=-2)
        zeros = zeros[..., : values.shape[-2], :]
    # Both carry the same offset, which cancels when a zero point is given.
    if zeros is None:
        values = values - (1 << (num_bits - 1))
    if g_idx is None:
        return dequantize_contiguous(values, weight_scale, zeros, dim=-1)
    return dequantize_groups(values, weight_scale, zeros, g_idx, dim=-1)


def expand_block_scales(
    scale: torch.Tensor, shape: torch.Size, block_size: tuple[int, int]
) -> torch.Tensor:
    """A block scale ``[..., ceil(N/bn), ceil(K/bk)]`` repeated over its ``[bn, bk]``
    blocks to ``shape`` ``[..., N, K]``; the last blocks may be partial."""
    rows, cols = shape[-2], shape[-1]
    block_rows, block_cols = block_size
    expanded = scale.repeat_interleave(block_rows, dim=-2)[..., :rows, :]
    return expanded.repeat_interleave(block_cols, dim=-1)[..., :cols]


def _per_row(scale: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A 1-D per-output-channel scale ``[N]`` as ``[N, 1]``; other scales
    (one element, ``[..., N, 1]``, ``[..., 1, 1]``) broadcast as they are."""
    return scale.unsqueeze(-1) if scale.ndim == 1 and scale.numel() > 1 else scale


def dequantize_fp8(
    weight: torch.Tensor,
    scale: torch.Tensor,
    block_size: tuple[int, int] | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """An fp8 weight ``[..., N, K]`` times its scale in float32: per tensor, per
    channel (``[N]``/``[..., N, 1]``), or per ``block_size`` block (DeepSeek)."""
    scale = scale.float()
    if block_size is not None:
        scale = expand_block_scales(scale, weight.shape, block_size)
    return (weight.float() * _per_row(scale, weight)).to(dtype)


def dequantize_int8(
    weight: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """An int8 weight ``[..., N, K]``: (weight - zero_point) * scale, both per
    tensor or per output channel as in :func:`dequantize_fp8`."""
    centred = weight.float()
    if zero_point is not None:
        centred = centred - _per_row(zero_point.float(), weight)
    return (centred * _per_row(scale.float(), weight)).to(dtype)


def e8m0_to_float(scales: torch.Tensor) -> torch.Tensor:
    """Biased power-of-two exponents (uint8 or e8m0): 2 ** (s - 127) in float32."""
    exponents = scales.view(torch.uint8).to(torch.int32) - E8M0_BIAS
    return torch.exp2(exponents.float())


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """The float32 values of e2m1 codes two per byte, the low nibble first:
    ``[..., K/2]`` uint8 (or float4_e2m1fn_x2) to ``[..., K]``."""
    codes = packed.view(torch.uint8).to(torch.int32)
    nibbles = torch.stack((codes & 0xF, codes >> _NIBBLE), dim=-1).flatten(-2)
    table = torch.tensor(E2M1_VALUES, device=packed.device)
    magnitude = table[nibbles & 0x7]
    return torch.where(nibbles & 0x8 != 0, -magnitude, magnitude)


def dequantize_mxfp4(
    packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """MXFP4: e2m1 codes ``[..., N, K/2]`` (or gpt-oss' ``[..., N, K/32, 16]``), one
    e8m0 scale per 32 inputs ``[..., N, K/32]`` -> weight ``[..., N, K]``."""
    if packed.ndim == scales.ndim + 1:
        packed = packed.flatten(-2)
    values = unpack_e2m1(packed)
    groups = values.unflatten(-1, (-1, MXFP4_GROUP_SIZE))
    scaled = groups * e8m0_to_float(scales).unsqueeze(-1)
    return scaled.flatten(-2).to(dtype)


def scaled_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """(a * a_scale) @ (b * b_scale) + bias, 8-bit ``a`` [M, K], ``b`` [K, N] upcast to
    ``out_dtype`` (exact in bf16); scales ([M, 1] or one; N) applied to the result."""
    out = torch.matmul(a.to(out_dtype), b.to(out_dtype))
    out = out * (a_scale.float() * b_scale.float().reshape(1, -1)).to(out_dtype)
    return out if bias is None else out + bias
