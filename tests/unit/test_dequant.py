"""The dequantization primitives against naive element-by-element references;
packed tensors come from the test packer of tests/quant_checkpoints.py (the
checkpoints the formats' own tools write are read end to end, in e2e tests)."""

import math

import pytest
import torch
from quant_checkpoints import AWQ_ORDER, Scheme, layer_tensors, pack, quantize

from vllm_hpu.quantization import dequant


def naive_unpack(packed: torch.Tensor, bits: int, order: tuple[int, ...]):
    """Value order[i] of each word's run sits in bits i*bits.., along dim 1."""
    per_word = 32 // bits
    rows, cols = packed.shape
    out = torch.empty(rows, cols * per_word, dtype=torch.int32)
    for r in range(rows):
        for c in range(cols):
            word = int(packed[r, c]) & 0xFFFFFFFF
            for i in range(per_word):
                out[r, c * per_word + order[i]] = (word >> (bits * i)) % (1 << bits)
    return out


@pytest.mark.parametrize(
    ("bits", "awq_order"), [(4, False), (4, True), (8, False), (2, False)]
)
def test_unpack_int32_matches_naive_bit_extraction(bits, awq_order):
    packed = torch.randint(-(2**31), 2**31 - 1, (5, 3), dtype=torch.int32)
    order = AWQ_ORDER if awq_order else tuple(range(32 // bits))
    expected = naive_unpack(packed, bits, order)
    actual = dequant.unpack_int32(packed, bits, 1, awq_order)
    torch.testing.assert_close(actual, expected)
    by_rows = dequant.unpack_int32(packed.t(), bits, 0, awq_order)
    torch.testing.assert_close(by_rows, expected.t().contiguous())


@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
def test_awq_dequantize_matches_reference(group_size):
    scheme = Scheme("awq", group_size)
    q = quantize(torch.randn(48, 256), scheme)
    t = layer_tensors(q, scheme)
    scales = t["scales"].float()
    weight = dequant.dequantize_awq(t["qweight"], t["qzeros"], scales)
    torch.testing.assert_close(weight, q.dequantized().t(), rtol=0, atol=0)


@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
@pytest.mark.parametrize(
    ("sym", "desc_act"), [(True, False), (False, False), (False, True)]
)
def test_gptq_dequantize_matches_reference(group_size, sym, desc_act):
    scheme = Scheme("gptq", group_size, sym=sym, desc_act=desc_act)
    q = quantize(torch.randn(48, 256), scheme, seed=3)
    t = layer_tensors(q, scheme)
    qzeros = None if sym else t["qzeros"]
    # Without desc_act, the consecutive groups (no g_idx) as the layers run them.
    g_idx = t["g_idx"] if desc_act else None
    weight = dequant.dequantize_gptq(t["qweight"], qzeros, t["scales"].float(), g_idx)
    torch.testing.assert_close(weight, q.dequantized().t(), rtol=0, atol=0)


def test_gptq_v2_zeros_are_stored_as_they_are():
    scheme = Scheme("gptq", 64)
    q = quantize(torch.randn(16, 128), scheme)
    t = layer_tensors(q, scheme)
    zeros = pack(q.zeros, 1)
    scales = t["scales"].float()
    weight = dequant.dequantize_gptq(t["qweight"], zeros, scales, q.g_idx, v1=False)
    torch.testing.assert_close(weight, q.dequantized().t(), rtol=0, atol=0)


def test_stacked_experts_dequantize_like_each_expert():
    scheme = Scheme("gptq", 32, desc_act=True)
    experts = [
        layer_tensors(quantize(torch.randn(16, 64), scheme, e), scheme)
        for e in range(3)
    ]
    stack = {k: torch.stack([t[k] for t in experts]) for k in experts[0]}
    weight = dequant.dequantize_gptq(
        stack["qweight"], stack["qzeros"], stack["scales"].float(), stack["g_idx"]
    )
    for e, t in enumerate(experts):
        one = dequant.dequantize_gptq(
            t["qweight"], t["qzeros"], t["scales"].float(), t["g_idx"]
        )
        torch.testing.assert_close(weight[e], one, rtol=0, atol=0)


def naive_pack_quantized(
    values: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    g_idx: torch.Tensor,
) -> torch.Tensor:
    out = torch.empty(values.shape)
    for n in range(values.shape[0]):
        for k in range(values.shape[1]):
            g = int(g_idx[k])
            zero = 0 if zeros is None else int(zeros[n, g])
            out[n, k] = (int(values[n, k]) - zero) * float(scales[n, g])
    return out


@pytest.mark.parametrize("num_bits", [4, 8])
@pytest.mark.parametrize("group_size", [16, 64, None])  # None: per channel
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("actorder", [False, True])
def test_pack_quantized_matches_naive_reference(
    num_bits, group_size, symmetric, actorder
):
    """Signed values stored with an offset of 2**(num_bits-1), the zero points
    packed along the output."""
    n, k = 24, 64
    lo, hi = -(1 << (num_bits - 1)), (1 << (num_bits - 1)) - 1
    gen = torch.Generator().manual_seed(num_bits)
    values = torch.randint(lo, hi + 1, (n, k), generator=gen, dtype=torch.int8)
    groups = 1 if group_size is None else k // group_size
    g_idx = torch.arange(k) // (k // groups)
    if actorder:
        g_idx = g_idx[torch.randperm(k, generator=gen)]
    scales = torch.rand(n, groups, generator=gen) + 0.01
    zeros = None
    packed_zeros = None
    if not symmetric:
        zeros = torch.randint(lo, hi + 1, (n, groups), generator=gen, dtype=torch.int8)
        packed_zeros = pack(zeros.int() - lo, 0, bits=num_bits)
    weight = dequant.dequantize_pack_quantized(
        pack(values.int() - lo, 1, bits=num_bits),
        scales,
        num_bits,
        packed_zeros,
        g_idx.int() if actorder else None,
    )
    expected = naive_pack_quantized(values, scales, zeros, g_idx)
    torch.testing.assert_close(weight, expected)


@pytest.mark.parametrize("shape", [(256, 384), (200, 300), (100, 64)])
def test_block_fp8_matches_naive_reference_with_partial_edge_blocks(shape):
    n, k = shape
    weight = (torch.randn(n, k) * 50).to(torch.float8_e4m3fn)
    scale_inv = torch.rand(math.ceil(n / 128), math.ceil(k / 128)) + 0.1
    actual = dequant.dequantize_fp8(weight, scale_inv, (128, 128))
    expected = torch.empty(n, k)
    for i in range(scale_inv.shape[0]):
        for j in range(scale_inv.shape[1]):
            rows, cols = slice(i * 128, (i + 1) * 128), slice(j * 128, (j + 1) * 128)
            expected[rows, cols] = weight[rows, cols].float() * scale_inv[i, j]
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def test_fp8_per_tensor_and_per_channel_scales():
    weight = (torch.randn(6, 8) * 10).to(torch.float8_e4m3fn)
    channel = torch.rand(6) + 0.5
    expected = torch.tensor(
        [[float(weight[i, j]) * float(channel[i]) for j in range(8)] for i in range(6)]
    )
    for scale in (channel, channel[:, None]):
        actual = dequant.dequantize_fp8(weight, scale)
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    one = torch.tensor(0.25)
    torch.testing.assert_close(
        dequant.dequantize_fp8(weight, one, dtype=torch.bfloat16),
        (weight.float() * 0.25).bfloat16(),
    )


def test_stacked_block_fp8_scales_apply_per_expert():
    weight = (torch.randn(2, 130, 70) * 20).to(torch.float8_e4m3fn)
    scale_inv = torch.rand(2, 2, 1) + 0.1
    actual = dequant.dequantize_fp8(weight, scale_inv, (128, 128))
    for e in range(2):
        expected = dequant.dequantize_fp8(weight[e], scale_inv[e], (128, 128))
        torch.testing.assert_close(actual[e], expected, rtol=0, atol=0)


def test_int8_with_channel_scales_and_zero_points():
    weight = torch.randint(-128, 128, (5, 7), dtype=torch.int8)
    scale, zero = torch.rand(5, 1), torch.randint(-4, 4, (5,))
    expected = torch.tensor(
        [
            [(int(weight[i, j]) - int(zero[i])) * float(scale[i]) for j in range(7)]
            for i in range(5)
        ]
    )
    actual = dequant.dequantize_int8(weight, scale, zero)
    torch.testing.assert_close(actual, expected)


def naive_e2m1(code: int) -> float:
    """Sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0; exponent 0 is
    subnormal (0 or 0.5)."""
    sign = -1.0 if code & 8 else 1.0
    exponent, mantissa = (code >> 1) & 3, code & 1
    if exponent == 0:
        return sign * 0.5 * mantissa
    return sign * 2.0 ** (exponent - 1) * (1 + 0.5 * mantissa)


def test_mxfp4_matches_naive_decoding():
    n, k = 3, 64
    gen = torch.Generator().manual_seed(0)
    packed = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    scales = torch.randint(120, 135, (n, k // 32), generator=gen, dtype=torch.uint8)
    expected = torch.empty(n, k)
    for i in range(n):
        for j in range(k):
            byte = int(packed[i, j // 2])
            code = byte & 0xF if j % 2 == 0 else byte >> 4
            expected[i, j] = naive_e2m1(code) * 2.0 ** (int(scales[i, j // 32]) - 127)
    torch.testing.assert_close(dequant.dequantize_mxfp4(packed, scales), expected)
    # gpt-oss' *_blocks [..., K/32, 16] hold the same bytes.
    blocks = packed.reshape(n, k // 32, 16)
    torch.testing.assert_close(dequant.dequantize_mxfp4(blocks, scales), expected)
    e8m0 = scales.view(torch.float8_e8m0fnu)
    torch.testing.assert_close(dequant.dequantize_mxfp4(packed, e8m0), expected)


def test_mxfp4_round_trips_every_code():
    values = torch.tensor(dequant.E2M1_VALUES).repeat(2, 8)  # [2, 64]
    values[1] = -values[1]
    codes = torch.arange(8).repeat(2, 8) + torch.tensor([[0], [8]])
    packed = (codes[:, 0::2] | codes[:, 1::2] << 4).to(torch.uint8)
    scales = torch.full((2, 2), 128, dtype=torch.uint8)  # 2 ** 1
    torch.testing.assert_close(dequant.dequantize_mxfp4(packed, scales), values * 2)
