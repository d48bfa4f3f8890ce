"""vLLM builds our out-of-tree op classes, dispatches to forward_oot, and the
results match forward_native and a hand-written formula."""

import pytest
import torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.custom_op import op_registry_oot
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

from vllm_hpu.ops import custom_ops
from vllm_hpu.ops.custom_ops import (
    HpuLlama4VisionRotaryEmbedding,
    HpuRMSNorm,
    HpuRotaryEmbedding,
    HpuSiluAndMul,
)


@pytest.fixture(autouse=True)
def vllm_config():  # type: ignore[no-untyped-def]
    with set_current_vllm_config(VllmConfig()) as config:
        yield config


def _rotate_reference(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool
) -> torch.Tensor:
    if neox:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def test_custom_ops_registration_is_idempotent() -> None:
    custom_ops._register_oot(RMSNorm, HpuRMSNorm)  # a second plugin load
    assert op_registry_oot["RMSNorm"] is HpuRMSNorm
    assert isinstance(RMSNorm(16), HpuRMSNorm)


@pytest.mark.parametrize("with_residual", [False, True])
def test_custom_ops_rms_norm_is_oot_and_matches_native(with_residual: bool) -> None:
    layer = RMSNorm(64, eps=1e-5)
    assert isinstance(layer, HpuRMSNorm)
    assert layer._forward_method == layer.forward_oot
    layer.weight.data.copy_(torch.randn(64))
    x = torch.randn(5, 64)
    residual = torch.randn(5, 64) if with_residual else None
    native = layer.forward_native(
        x.clone(), None if residual is None else residual.clone()
    )
    out = layer(x.clone(), None if residual is None else residual.clone())
    summed = x + residual if residual is not None else x
    expected = summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + 1e-5)
    expected = expected * layer.weight.data
    if with_residual:
        torch.testing.assert_close(out, native)
        torch.testing.assert_close(out[0], expected)
        torch.testing.assert_close(out[1], summed)
    else:
        torch.testing.assert_close(out, native)
        torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("neox", [True, False])
def test_custom_ops_rotary_embedding_is_oot_and_matches_native(neox: bool) -> None:
    head_size, rotary_dim = 64, 32
    layer = RotaryEmbedding(head_size, rotary_dim, 128, 10000.0, neox, torch.float32)
    assert isinstance(layer, HpuRotaryEmbedding)
    assert layer._forward_method == layer.forward_oot
    positions = torch.tensor([0, 3, 7, 127])
    query, key = torch.randn(4, 2 * head_size), torch.randn(4, head_size)
    native = layer.forward_native(positions, query.clone(), key.clone())
    out_query, out_key = layer(positions, query.clone(), key.clone())
    torch.testing.assert_close(out_query, native[0])
    torch.testing.assert_close(out_key, native[1])

    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)
    angles = positions[:, None].float() * inv_freq[None, :]
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]
    heads = key.view(4, 1, head_size)
    expected = torch.cat(
        (
            _rotate_reference(heads[..., :rotary_dim], cos, sin, neox),
            heads[..., rotary_dim:],
        ),
        dim=-1,
    )
    assert out_key is not None
    torch.testing.assert_close(
        out_key.view(4, 1, head_size), expected, atol=1e-5, rtol=1e-5
    )


def test_custom_ops_llama4_vision_rotary_is_real_and_matches_transformers() -> None:
    """vLLM's Llama 4 tower builds ours (no complex tensor, which Gaudi lacks);
    it rotates as transformers' complex formula on 4 x 4 patches and a CLS."""
    from transformers import Llama4VisionConfig
    from transformers.models.llama4 import modeling_llama4 as hf
    from vllm.model_executor.layers.rotary_embedding import get_rope

    config = Llama4VisionConfig(
        hidden_size=64,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    rope = get_rope(
        head_size=32,
        max_position=16,
        rope_parameters={
            "rope_type": "mllama4",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
        },
        is_neox_style=False,
        dtype=torch.complex64,
    )
    assert isinstance(rope, HpuLlama4VisionRotaryEmbedding)
    assert rope._forward_method == rope.forward_oot
    assert not rope.cos_sin_cache.is_complex()
    query, key = torch.randn(3, 17, 2, 32), torch.randn(3, 17, 2, 32)
    freqs_ci = hf.Llama4VisionRotaryEmbedding._compute_freqs_ci(config)
    expected = hf.vision_apply_rotary_emb(query, key, freqs_ci)
    out = rope(query, key)
    torch.testing.assert_close(out, expected)
    assert not torch.allclose(out[0], query)


def test_custom_ops_silu_and_mul_is_oot_and_matches_native() -> None:
    layer = SiluAndMul()
    assert isinstance(layer, HpuSiluAndMul)
    assert layer._forward_method == layer.forward_oot
    x = torch.randn(3, 2 * 32)
    expected = torch.nn.functional.silu(x[:, :32]) * x[:, 32:]
    torch.testing.assert_close(layer(x), layer.forward_native(x))
    torch.testing.assert_close(layer(x), expected)
