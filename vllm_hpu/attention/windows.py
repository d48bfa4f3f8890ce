"""Sliding-window and chunked local attention layers in one KV cache group: every
layer keeps all its blocks, and each windowed (or chunked) layer reads only the
blocks inside its window (or its current chunk of ``attention_chunk_size``
positions, Llama 4).

Why one group: vLLM would put windowed layers in a group of their own (hybrid
allocator) with its own block table, and free blocks that leave the window. The
runner, bucketing and warmup keep one block table per request, so windowed and
chunked layers get a full-attention spec instead (vLLM's own route when the
hybrid allocator is off): they cost the KV memory of a full layer, never fewer
blocks than a full one.
"""

from collections.abc import Iterable

from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    SlidingWindowSpec,
)


def full_attention_spec(spec: AttentionSpec, block_size: int) -> AttentionSpec:
    """A windowed or chunked layer's spec as full attention with the runner's
    block size."""
    if not isinstance(spec, (SlidingWindowSpec, ChunkedLocalAttentionSpec)):
        return spec
    return FullAttentionSpec(
        block_size=block_size,
        num_kv_heads=spec.num_kv_heads,
        head_size=spec.head_size,
        head_size_v=spec.head_size_v,
        dtype=spec.dtype,
        kv_quant_mode=spec.kv_quant_mode,
    )


def layer_windows(layers: Iterable[object]) -> list[int | None]:
    """Each attention layer's binding window (None: full attention), as its
    attention impl settled it (a window no shorter than the model is None)."""
    return [
        getattr(getattr(layer, "impl", None), "sliding_window", None)
        for layer in layers
    ]


def layer_chunks(layers: Iterable[object]) -> list[int | None]:
    """Each attention layer's chunk size (None: not chunked), as vLLM's
    ChunkedLocalAttention layer holds it."""
    return [getattr(layer, "attention_chunk_size", None) for layer in layers]
