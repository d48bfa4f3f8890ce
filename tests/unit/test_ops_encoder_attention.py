"""The encoder attention override (one block-diagonal masked attention over the
whole pass) against vLLM's own path, which attends image by image with torch SDPA
(MMEncoderAttention.forward_native), for Qwen2-VL's and CLIP's input layouts, with
the fused kernel (torch's, in emulation) and with VLLM_PROMPT_USE_FUSEDSDPA=0."""

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from test_ops_sliced_attention import LargestOutput
from torch._dynamo.testing import CompileCounter
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.attention import MMEncoderAttention
from vllm.v1.attention.backends.registry import AttentionBackendEnum

from vllm_hpu import device, envs
from vllm_hpu.ops.custom_ops import HpuMMEncoderAttention
from vllm_hpu.ops.encoder_attention import block_diagonal_mask, encoder_attention
from vllm_hpu.ops.sliced_attention import NO_SLICING, PromptSlicing

NUM_HEADS = 4
SEQ_LEN = 64
# Span boundaries of a 64-patch pass: one image; images of different lengths
# ending in a 4-patch padding image (bucketing/vision_buckets.py); and
# the repeated trailing boundaries Qwen2-VL's prepare_encoder_metadata pads
# cu_seqlens with.
CU_SEQLENS = {
    "one-image": [0, 64],
    "three-sizes": [0, 16, 20, 52, 64],
    "padded-tail": [0, 24, 40, 60, 64, 64, 64],
}
TILES = PromptSlicing(threshold=16, chunk_size=16)
# bf16 output against the fp32 result on the same (bf16-rounded) inputs.
TOLERANCE = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
}


@pytest.fixture(autouse=True)
def vllm_config():  # type: ignore[no-untyped-def]
    with set_current_vllm_config(VllmConfig()) as config:
        yield config


@pytest.fixture(params=[True, False], ids=["fused", "unfused"])
def fused_sdpa(request, monkeypatch) -> Iterator[bool]:  # type: ignore[no-untyped-def]
    """VLLM_PROMPT_USE_FUSEDSDPA on or off, with the kernel looked up afresh."""
    monkeypatch.setenv("VLLM_PROMPT_USE_FUSEDSDPA", str(int(request.param)))
    monkeypatch.setattr(device, "_KERNELS", {})
    envs.get_envs.cache_clear()
    yield request.param
    envs.get_envs.cache_clear()


def _layer(head_size: int) -> MMEncoderAttention:
    layer = MMEncoderAttention(NUM_HEADS, head_size, scale=head_size**-0.5)
    assert isinstance(layer, HpuMMEncoderAttention)
    assert layer._forward_method == layer.forward_oot
    return layer


def _check(
    layer: MMEncoderAttention,
    qkv: list[torch.Tensor],
    cu_seqlens: torch.Tensor | None,
    dtype: torch.dtype,
) -> None:
    """The override in ``dtype`` against vLLM's per-image SDPA in fp32."""
    q, k, v = (x.to(dtype) for x in qkv)
    out = layer(q, k, v, cu_seqlens=cu_seqlens)
    expected = layer.forward_native(q.float(), k.float(), v.float(), cu_seqlens)
    assert out.dtype == dtype and out.shape == expected.shape
    torch.testing.assert_close(out.float(), expected, **TOLERANCE[dtype])


@pytest.mark.parametrize("slicing", [NO_SLICING, TILES], ids=["whole", "tiles"])
@pytest.mark.parametrize("dtype", TOLERANCE, ids=str)
@pytest.mark.parametrize("head_size", [16, 80])  # 80: a fused-kernel size
@pytest.mark.parametrize("spans", CU_SEQLENS, ids=str)
def test_encoder_attention_matches_per_image_sdpa(
    spans: str,
    head_size: int,
    dtype: torch.dtype,
    slicing: PromptSlicing,
    fused_sdpa: bool,
) -> None:
    """Qwen2-VL's layout: [1, patches, heads, head_size] and cu_seqlens; whole,
    and cut into tiles that cross the images' boundaries."""
    torch.manual_seed(0)
    layer = _layer(head_size)
    layer.slicing = slicing
    qkv = [torch.randn(1, SEQ_LEN, NUM_HEADS, head_size) for _ in range(3)]
    cu_seqlens = torch.tensor(CU_SEQLENS[spans], dtype=torch.int32)
    _check(layer, qkv, cu_seqlens, dtype)


@pytest.mark.parametrize("dtype", TOLERANCE, ids=str)
def test_encoder_attention_full_without_cu_seqlens(
    dtype: torch.dtype, fused_sdpa: bool
) -> None:
    """CLIP's layout: [images, tokens, hidden], every token sees its whole row."""
    torch.manual_seed(0)
    layer = _layer(16)
    qkv = [torch.randn(3, 17, NUM_HEADS * 16) for _ in range(3)]
    _check(layer, qkv, None, dtype)


def test_encoder_attention_in_tiles_never_holds_a_patch_by_patch_tensor() -> None:
    """Cut, no op makes a [P, P] mask or scores (whole, the same pass does)."""
    patches, head_size = 128, 16
    qkv = [torch.randn(1, patches, NUM_HEADS, head_size) for _ in range(3)]
    cu_seqlens = torch.tensor([0, 50, 115, 128], dtype=torch.int32)

    def largest(slicing: PromptSlicing) -> int:
        with LargestOutput() as watch:
            encoder_attention(*qkv, head_size**-0.5, cu_seqlens, slicing)
        return watch.numel

    assert largest(NO_SLICING) >= patches * patches
    tile = TILES.chunk_size
    assert largest(TILES) <= max(NUM_HEADS * tile * tile, patches * NUM_HEADS * 16)
    assert largest(TILES) < patches * patches


def test_block_diagonal_mask_spans() -> None:
    """Spans by hand, a token past cu_seqlens[-1] in a span of its own."""
    cu_seqlens = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    mask = block_diagonal_mask(cu_seqlens, 2, 6, torch.device("cpu"))
    image_ids = torch.tensor([0, 0, 2, 2, 2, 3])
    visible = image_ids[:, None] == image_ids[None, :]
    allowed = mask.allowed(slice(0, 6), slice(0, 6))
    assert allowed.shape == (2, 6, 6)
    assert torch.equal(allowed[0], visible) and torch.equal(allowed[1], visible)


def test_encoder_attention_one_graph_for_any_image_lengths() -> None:
    """The forward reads no value of cu_seqlens: compiled whole (fullgraph), one
    graph serves passes of the same shape whatever their images' lengths."""
    layer = _layer(16)
    counter = CompileCounter()
    compiled = torch.compile(
        layer.forward_oot, backend=counter, fullgraph=True, dynamic=False
    )
    qkv = [torch.randn(1, SEQ_LEN, NUM_HEADS, 16) for _ in range(3)]
    for spans in ("three-sizes", "padded-tail"):
        cu_seqlens = torch.tensor(CU_SEQLENS[spans][:5], dtype=torch.int32)
        compiled(*qkv, cu_seqlens=cu_seqlens)
    assert counter.frame_count == 1


def test_encoder_attention_cu_seqlens_classmethods_delegate_once() -> None:
    """vLLM forwards these classmethods to the registered class; ours keeps vLLM's
    (no recursion), which only moves cu_seqlens to the device."""
    cu_seqlens = np.array([0, 16, 40], dtype=np.int32)
    backend = AttentionBackendEnum.TORCH_SDPA
    cpu = torch.device("cpu")
    assert MMEncoderAttention.maybe_compute_seq_lens(backend, cu_seqlens, cpu) is None
    moved = MMEncoderAttention.maybe_recompute_cu_seqlens(
        backend, cu_seqlens, 64, 1, cpu
    )
    assert moved.tolist() == cu_seqlens.tolist()
