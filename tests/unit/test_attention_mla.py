"""The MLA backend's contract with vLLM: selection, cache shape, refusals, and the
metadata fields vLLM's MLAAttention layer reads to split prompt and decode tokens."""

import pytest
import torch
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.selector import AttentionSelectorConfig

from vllm_hpu import platform
from vllm_hpu.attention.metadata import (
    CacheGeometry,
    SeqLayout,
    build_decode_metadata,
    build_prompt_metadata,
)
from vllm_hpu.attention.mla import HpuMLABackend, check_mla_supported

LATENT_SIZE = 80  # kv_lora_rank 64 + qk_rope_head_dim 16, as in tiny-deepseek-v2


def _config(**overrides: object) -> AttentionSelectorConfig:
    base = AttentionSelectorConfig(
        head_size=LATENT_SIZE,
        dtype=torch.bfloat16,
        kv_cache_dtype="auto",
        block_size=128,
        use_mla=True,
    )
    return base._replace(**overrides)


def test_mla_backend_selected_by_platform_for_mla_layers() -> None:
    selected = platform.HpuPlatform.get_attn_backend_cls(
        AttentionBackendEnum.CUSTOM, _config()
    )
    assert selected == platform.MLA_BACKEND_CLS
    assert HpuMLABackend.is_mla()
    assert HpuMLABackend.supports_head_size(LATENT_SIZE)


def test_sparse_mla_layers_get_the_sparse_backend() -> None:
    """DeepSeek-V3.2's layers: the latent cache, each query under its top-k."""
    from vllm_hpu.attention.sparse_mla import HpuSparseMLABackend, HpuSparseMLAImpl

    selected = platform.HpuPlatform.get_attn_backend_cls(
        AttentionBackendEnum.CUSTOM, _config(use_sparse=True)
    )
    assert selected == platform.SPARSE_MLA_BACKEND_CLS
    assert HpuSparseMLABackend.is_sparse() and HpuSparseMLABackend.is_mla()
    assert HpuSparseMLABackend.get_impl_cls() is HpuSparseMLAImpl
    assert HpuSparseMLAImpl.is_sparse


def test_mla_backend_cache_is_one_latent_row_per_slot_with_dummy_block() -> None:
    assert HpuMLABackend.get_kv_cache_shape(10, 16, 1, LATENT_SIZE) == (
        11 * 16,
        LATENT_SIZE,
    )


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"has_sliding_window": True}, "sliding-window MLA"),
        ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype=fp8"),
        ({"block_size": 24}, "block size 24"),
    ],
)
def test_mla_backend_refuses_with_clear_error(
    overrides: dict[str, object], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        check_mla_supported(_config(**overrides))


def test_mla_backend_refuses_fullgraph_compilation(hpu_env) -> None:
    hpu_env(VLLM_T_COMPILE_FULLGRAPH="1")
    with pytest.raises(ValueError, match="unset VLLM_T_COMPILE_FULLGRAPH"):
        check_mla_supported(_config())


def test_metadata_splits_passes_for_mla_layers() -> None:
    cache = CacheGeometry(16, 8, torch.float32, torch.device("cpu"))
    rows = [SeqLayout([0, 1], 20, 1), SeqLayout([2], 3, 1)]
    decode = build_decode_metadata(rows, 4, 8, cache)
    assert (decode.num_actual_tokens, decode.num_decode_tokens) == (4, 4)
    assert decode.num_decodes == 4 and decode.num_prefills == 0
    assert decode.decode is not None
    assert torch.equal(decode.decode.block_list, decode.decode_blocks().block_list)

    prompt = build_prompt_metadata([SeqLayout([3], 0, 5)], 2, 16, 0, cache)
    assert (prompt.num_actual_tokens, prompt.num_decode_tokens) == (32, 0)
    assert prompt.num_decodes == 0 and prompt.num_prefills == 2
    assert prompt.decode is None
    # vLLM's sparse MLA runs a prompt pass as MHA (forward_mha) when its
    # metadata's prefill says so.
    assert prompt.prefill is prompt and prompt.use_dense_mha
    assert decode.prefill is None
