"""The backend's contract with vLLM: name, registration, block sizes, refusals."""

from types import SimpleNamespace

import pytest
import torch
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.selector import AttentionSelectorConfig

from vllm_hpu import platform
from vllm_hpu.attention import backend
from vllm_hpu.attention.backend import (
    HpuAttentionBackend,
    HpuAttentionImpl,
    check_supported,
)
from vllm_hpu.ops import layer_options


def _config(**overrides: object) -> AttentionSelectorConfig:
    base = AttentionSelectorConfig(
        head_size=128, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=128
    )
    return base._replace(**overrides)


def test_attention_backend_registered_as_custom_idempotently() -> None:
    backend.register()
    backend.register()
    assert HpuAttentionBackend.get_name() == "CUSTOM"
    assert AttentionBackendEnum.CUSTOM.get_path() == platform.ATTN_BACKEND_CLS


def test_attention_backend_prefers_platform_block_size() -> None:
    # vLLM asks with its own default (16) after model load: the answer must
    # stay the platform's size, or the engine silently runs 16-token blocks.
    for default in (16, platform.DEFAULT_BLOCK_SIZE, 100):
        preferred = HpuAttentionBackend.get_preferred_block_size(default)
        assert preferred == platform.DEFAULT_BLOCK_SIZE
    assert HpuAttentionBackend.supports_block_size(16)
    assert not HpuAttentionBackend.supports_block_size(24)


def test_attention_backend_kv_cache_shape_has_dummy_block() -> None:
    assert HpuAttentionBackend.get_kv_cache_shape(10, 128, 8, 64) == (
        2,
        11 * 128,
        8,
        64,
    )


def test_attention_backend_accepts_plain_decoder() -> None:
    check_supported(_config())
    check_supported(_config(block_size=None, kv_cache_dtype=None, dtype=torch.float32))


@pytest.mark.parametrize("head_size", [32, 40, 72, 136, 256, 512])
def test_attention_backend_accepts_windows_and_head_sizes(head_size: int) -> None:
    check_supported(_config(head_size=head_size, has_sliding_window=True))


def test_attention_backend_accepts_sinks() -> None:
    check_supported(_config(has_sink=True, has_sliding_window=True))  # gpt-oss


def test_attention_impl_takes_one_sink_per_head() -> None:
    sinks = torch.zeros(4)
    impl = HpuAttentionImpl(4, 64, 0.125, 2, sinks=sinks)
    assert impl.scoring.sinks is sinks  # by reference: loaded after construction
    with pytest.raises(ValueError, match="one sink per head"):
        HpuAttentionImpl(4, 64, 0.125, 2, sinks=torch.zeros(2))


def test_attention_backend_preferred_block_size_for_chunked_layers() -> None:
    # Llama 4's chunked layers get a subclass of our backend beside it: vLLM's
    # default answer for several backends (16) would replace the platform's.
    chunked = type("ChunkedLocalAttention_8_CUSTOM", (HpuAttentionBackend,), {})
    size = platform.HpuPlatform._preferred_block_size_for_backends(
        [HpuAttentionBackend, chunked], 16, None
    )
    assert size == platform.DEFAULT_BLOCK_SIZE


def test_attention_backend_accepts_encoder_only_layers_for_pooling() -> None:
    check_supported(_config(attn_type=AttentionType.ENCODER_ONLY))


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"use_sparse": True}, "sparse"),
        ({"attn_type": AttentionType.ENCODER}, "encoder attention"),
        ({"attn_type": AttentionType.ENCODER_DECODER}, "encoder_decoder"),
        ({"use_non_causal": True}, "non-causal"),
        ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype=fp8"),
        ({"head_size": 36}, "head size 36"),
        ({"head_size": 24}, "head size 24"),
        ({"head_size": 520}, "head size 520"),
        ({"block_size": 24}, "block size 24"),
    ],
)
def test_attention_backend_refuses_with_clear_error(
    overrides: dict[str, object], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        check_supported(_config(**overrides))


def test_attention_backend_selected_by_platform() -> None:
    path = platform.HpuPlatform.get_attn_backend_cls(
        AttentionBackendEnum.CUSTOM, _config()
    )
    assert path == platform.ATTN_BACKEND_CLS


@pytest.mark.parametrize(("window", "binding"), [(63, 63), (64, None), (4096, None)])
def test_attention_impl_window_that_cannot_bind_is_full_attention(
    window: int, binding: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Mistral's 4096 window with max_model_len 64 never hides a key.
    config = SimpleNamespace(model_config=SimpleNamespace(max_model_len=64))
    monkeypatch.setattr(
        layer_options, "get_current_vllm_config_or_none", lambda: config
    )
    impl = HpuAttentionImpl(4, 64, 0.125, 2, sliding_window=window)
    assert impl.sliding_window == binding


@pytest.mark.parametrize(
    ("head_size", "soft_cap", "alibi", "fused"),
    [
        (64, None, None, True),
        (40, None, None, False),
        (64, 30.0, None, False),
        (64, None, [0.5, 0.25, 0.125, 0.0625], False),
    ],
)
def test_attention_impl_decides_fused_prompt_kernel(
    head_size: int, soft_cap: float | None, alibi: list[float] | None, fused: bool
) -> None:
    impl = HpuAttentionImpl(
        4, head_size, 0.125, 2, alibi_slopes=alibi, logits_soft_cap=soft_cap
    )
    assert impl.scoring.use_fused == fused
    assert impl.scoring.logits_soft_cap == soft_cap
