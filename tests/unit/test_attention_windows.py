"""Windowed layers share the one KV cache group: their specs become full
attention, and the runner learns each layer's binding window from its impl."""

from types import SimpleNamespace

import torch
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    SlidingWindowSpec,
)

from vllm_hpu.attention.windows import full_attention_spec, layer_chunks, layer_windows


def test_sliding_window_spec_becomes_full_attention() -> None:
    spec = SlidingWindowSpec(
        block_size=16, num_kv_heads=2, head_size=40, dtype=torch.bfloat16,
        sliding_window=32,
    )  # fmt: skip
    full = full_attention_spec(spec, 128)
    assert isinstance(full, FullAttentionSpec) and full.sliding_window is None
    assert (full.block_size, full.num_kv_heads, full.head_size) == (128, 2, 40)
    assert full.dtype == torch.bfloat16
    assert full.page_size_bytes == spec.page_size_bytes * 128 // 16
    plain = FullAttentionSpec(
        block_size=128, num_kv_heads=2, head_size=40, dtype=torch.bfloat16
    )
    assert full_attention_spec(plain, 128) is plain


def test_layer_windows_read_from_impls() -> None:
    layers = [
        SimpleNamespace(impl=SimpleNamespace(sliding_window=32)),
        SimpleNamespace(impl=SimpleNamespace(sliding_window=None)),
    ]
    assert layer_windows(layers) == [32, None]


def test_chunked_local_spec_becomes_full_attention() -> None:
    spec = ChunkedLocalAttentionSpec(
        block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float32,
        attention_chunk_size=40,
    )  # fmt: skip
    full = full_attention_spec(spec, 128)
    assert isinstance(full, FullAttentionSpec)
    assert not isinstance(full, ChunkedLocalAttentionSpec)
    assert full.block_size == 128


def test_layer_chunks_read_from_layers() -> None:
    # vLLM's ChunkedLocalAttention holds the size on the layer, not its impl.
    layers = [SimpleNamespace(attention_chunk_size=40), SimpleNamespace()]
    assert layer_chunks(layers) == [40, None]
