"""Windowed layers get KV cache groups of their own under vLLM's hybrid KV cache
manager (their specs become full attention where it is off), the groups share
their caches as vLLM's config lays them out, and the runner learns each layer's
binding window from its impl."""

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)

from vllm_hpu.attention.windows import (
    choose_kv_cache_manager,
    full_attention_spec,
    layer_chunks,
    layer_spec,
    layer_windows,
)
from vllm_hpu.worker.kv_caches import (
    bind_kv_caches,
    group_cache_geometry,
    layer_groups,
    reachable_decode_blocks,
)


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


WINDOW = SlidingWindowSpec(
    block_size=16, num_kv_heads=2, head_size=8, dtype=torch.float32,
    sliding_window=40,
)  # fmt: skip
FULL = FullAttentionSpec(
    block_size=16, num_kv_heads=2, head_size=8, dtype=torch.float32
)


def test_sliding_window_keeps_its_spec_under_the_hybrid_manager() -> None:
    assert layer_spec(WINDOW, 16, hybrid=True) == WINDOW
    assert isinstance(layer_spec(WINDOW, 16, hybrid=False), FullAttentionSpec)
    assert not isinstance(layer_spec(WINDOW, 16, hybrid=False), SlidingWindowSpec)


def _vllm_config(disable: bool | None, speculative: object = None) -> Any:
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=disable),
        speculative_config=speculative,
        kv_transfer_config=None,
        parallel_config=SimpleNamespace(pipeline_parallel_size=1),
        model_config=SimpleNamespace(attention_chunk_size=None),
    )


def test_hybrid_manager_off_where_groups_cannot_run() -> None:
    plain = _vllm_config(None)
    choose_kv_cache_manager(plain, None)
    assert plain.scheduler_config.disable_hybrid_kv_cache_manager is None
    speculative = _vllm_config(None, speculative=object())
    choose_kv_cache_manager(speculative, None)
    assert speculative.scheduler_config.disable_hybrid_kv_cache_manager is True
    with pytest.raises(ValueError, match="speculative decoding"):
        choose_kv_cache_manager(_vllm_config(False, speculative=object()), False)


def test_hybrid_manager_choice_reads_the_users_not_the_field() -> None:
    """vLLM writes its default (False) into the field after the first pass: the
    engine core's pass must not take it for the user's
    --no-disable-hybrid-kv-cache-manager."""
    speculative = _vllm_config(False, speculative=object())
    choose_kv_cache_manager(speculative, None)
    assert speculative.scheduler_config.disable_hybrid_kv_cache_manager is True


class _Layer:
    def __init__(self, window: int | None) -> None:
        self.impl = SimpleNamespace(sliding_window=window)
        self.kv_cache: Any = None

    def bind_kv_cache(self, kv_cache: Any) -> None:
        self.kv_cache = kv_cache


def _gemma_like() -> tuple[dict[str, Any], KVCacheConfig]:
    """Windowed and global layers alternating, in two KV cache groups."""
    layers = {f"l{i}": _Layer(40 if i % 2 == 0 else None) for i in range(4)}
    config = KVCacheConfig(
        num_blocks=6,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["l0", "l2"], WINDOW),
            KVCacheGroupSpec(["l1", "l3"], FULL),
        ],
    )
    return layers, config


def test_kv_cache_groups_share_caches_and_have_their_own_geometry() -> None:
    layers, config = _gemma_like()
    caches = bind_kv_caches(layers, config, torch.device("cpu"))
    # The i-th layer of each group shares one cache: two caches, not four.
    assert caches["l0"] is caches["l1"] and caches["l2"] is caches["l3"]
    assert caches["l0"] is not caches["l2"]
    assert layers["l3"].kv_cache is caches["l3"]
    cache = group_cache_geometry(layers, config, torch.float32, torch.device("cpu"))
    windowed, full = cache.group_geometries()
    assert (windowed.sliding_windows, windowed.full_attention) == ((40,), False)
    assert (full.sliding_windows, full.full_attention) == ((), True)
    assert layer_groups(config) == {"l0": 0, "l2": 0, "l1": 1, "l3": 1}


def test_decode_buckets_reach_past_the_cache_when_every_group_windows() -> None:
    # A global group holds every block of its table: tables fit the cache.
    assert reachable_decode_blocks(_gemma_like()[1], 8, 512) == 6
    windows_only = KVCacheConfig(6, [], [KVCacheGroupSpec(["l0", "l1"], WINDOW)])
    # Windows free blocks behind them: 8 tables of 512 tokens, null blocks too.
    assert reachable_decode_blocks(windows_only, 8, 512) == 8 * 32
