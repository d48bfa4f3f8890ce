"""Sliding-window and chunked local attention layers: which KV cache groups they
get, and each layer's binding window (or chunk of ``attention_chunk_size``
positions, Llama 4).

Sliding windows go to vLLM's hybrid KV cache manager: windowed layers form KV
cache groups of their own, with their own block tables, and the blocks that fall
out of a window are freed for other requests (the block table keeps vLLM's null
block, id 0, in their place; the layers' masks hide it). Where the runner cannot
run groups yet (speculative decoding, KV connectors, pipeline stages, chunked
local attention, layers of different head sizes), the platform turns the hybrid
manager off and windowed and chunked layers get a full-attention spec: one
block table, every block kept.
"""

from collections.abc import Iterable
from dataclasses import replace

from vllm.config import VllmConfig
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    SlidingWindowSpec,
)

# Drafts a hybrid model verifies (config/hybrid.py refuses the others): its
# states kept per draft; n-gram drafts, and its own MTP layer, attention only
# (drafting runs no state layer).
HYBRID_DRAFTS = ("ngram", "mtp")


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


def layer_spec(spec: AttentionSpec, block_size: int, hybrid: bool) -> AttentionSpec:
    """The spec the cache manager sizes for a layer: a sliding window keeps its
    own spec under the hybrid manager (its blocks are freed), anything else
    windowed or chunked becomes full attention."""
    if hybrid and isinstance(spec, SlidingWindowSpec):
        return replace(spec, block_size=block_size)
    return full_attention_spec(spec, block_size)


def groups_unsupported(vllm_config: VllmConfig) -> str | None:
    """Why the runner cannot run KV cache groups of their own with this
    configuration (None: it can)."""
    from vllm_hpu.kv_transfer.connectors import has_kv_connector

    model_config = vllm_config.model_config
    speculative = vllm_config.speculative_config
    # A hybrid's state layers need their groups: its drafts run there.
    if speculative is not None and not (
        speculative.method in HYBRID_DRAFTS
        and model_config is not None
        and model_config.is_hybrid
    ):
        return "speculative decoding"
    if has_kv_connector(vllm_config):
        return "a KV connector"
    if vllm_config.parallel_config.pipeline_parallel_size > 1:
        return "pipeline parallelism"
    if model_config is None:
        return None
    if model_config.attention_chunk_size is not None:
        return "chunked local attention"
    if len(layer_head_sizes(model_config.hf_text_config)) > 1:
        # vLLM would equal the groups' pages with blocks of several sizes.
        return "attention layers of different head sizes"
    return None


def layer_head_sizes(text_config: object) -> set[int]:
    """The head sizes a config gives its layers one by one (Gemma 4's global
    layers are wider than its windowed ones); empty where it gives none."""
    per_layer = getattr(text_config, "per_layer_config", None) or ()
    return {size for layer in per_layer if (size := getattr(layer, "head_dim", None))}


def choose_kv_cache_manager(vllm_config: VllmConfig, asked: bool | None) -> None:
    """Leave vLLM's hybrid KV cache manager on (its default) where the runner
    runs KV cache groups; turn it off, or refuse an explicit request for it
    (``asked``: --disable-hybrid-kv-cache-manager as the user gave it, None
    when not given), where it does not. The same on every pass over a config:
    the field itself holds vLLM's default or this choice after the first."""
    why_not = groups_unsupported(vllm_config)
    if why_not is None or asked:
        return
    if asked is False:
        raise ValueError(
            "The HPU plugin does not run the hybrid KV cache manager with "
            f"{why_not} yet; drop --no-disable-hybrid-kv-cache-manager "
            "(sliding-window layers then keep every block)."
        )
    vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = True


def hybrid_kv_cache(vllm_config: VllmConfig) -> bool:
    """Whether vLLM's hybrid KV cache manager is on (settled by the time the
    worker reports its specs)."""
    return not vllm_config.scheduler_config.disable_hybrid_kv_cache_manager


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
