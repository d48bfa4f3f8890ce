"""The metadata builders: token layout, dummy-block padding, flat block layout."""

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from vllm_hpu.attention.metadata import (
    CacheGeometry,
    HpuAttentionMetadata,
    SeqLayout,
    build_decode_metadata,
    build_prompt_metadata,
)
from vllm_hpu.ops.prompt_mask import PromptBias
from vllm_hpu.worker.passes.seqs import ImageSpans, image_spans

BLOCK_SIZE = 4
DUMMY = 9  # num_blocks
CACHE = CacheGeometry(BLOCK_SIZE, DUMMY, torch.float32, torch.device("cpu"))
CLAMPS = "mm_prefix_clamp_sliding_window"  # vLLM's attention layers' flag


def _in_dummy(slots: torch.Tensor) -> bool:
    return bool(((slots // BLOCK_SIZE) == DUMMY).all())


def test_metadata_prompt_slot_mapping_follows_token_layout() -> None:
    seqs = [SeqLayout([5, 2], 0, 6), SeqLayout([7, 1, 3], 5, 3)]
    meta = build_prompt_metadata(seqs, 3, 8, 2, CACHE)
    slots = meta.slot_mapping.view(3, 8)
    assert slots[0, :6].tolist() == [20, 21, 22, 23, 8, 9]
    assert slots[1, :3].tolist() == [5, 6, 7]  # positions 5..7 in block 1
    assert _in_dummy(slots[0, 6:]) and _in_dummy(slots[1, 3:]) and _in_dummy(slots[2])
    assert meta.slot_mapping.dtype == torch.long
    assert meta.block_list is not None
    assert meta.block_list.tolist() == [DUMMY, DUMMY, 7, 1, DUMMY, DUMMY]


def _visible(
    meta: HpuAttentionMetadata, window: int | None = None, chunk: int | None = None
) -> list:  # type: ignore[type-arg]
    """The whole pass's mask as 0/1 lists [bs][q][K], from the tiled bias."""
    assert meta.prompt_mask is not None
    bias = PromptBias(meta.prompt_mask, torch.float32, window, None, chunk).whole()
    return (bias[:, 0] == 0).int().tolist()


def test_metadata_prompt_mask_past_current_and_padding() -> None:
    seqs = [SeqLayout([0, 1], 2, 3)]
    meta = build_prompt_metadata(seqs, 2, 4, 1, CACHE)
    visible = _visible(meta)
    # keys: 4 past slots (2 cached) then 4 current tokens (3 real).
    assert visible[0] == [
        [1, 1, 0, 0, 1, 0, 0, 0],
        [1, 1, 0, 0, 1, 1, 0, 0],
        [1, 1, 0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 0, 0, 1],  # padded query: itself only
    ]
    assert visible[1] == [[0] * 4 + [int(k == t) for k in range(4)] for t in range(4)]


def test_metadata_prompt_without_context_has_no_block_list() -> None:
    meta = build_prompt_metadata([SeqLayout([3], 0, 2)], 1, 4, 0, CACHE)
    assert meta.block_list is None and meta.is_prompt
    assert meta.prompt_mask is not None
    assert (meta.prompt_mask.query_len, meta.prompt_mask.num_keys) == (4, 4)


def test_metadata_decode_flat_layout() -> None:
    seqs = [SeqLayout([4, 0, 8], 8, 1), SeqLayout([6], 1, 1)]  # seq_lens 9 and 2
    meta = build_decode_metadata(seqs, 3, 6, CACHE)
    blocks = meta.decode_blocks()
    assert blocks.block_list.tolist() == [4, 0, 8, 6, DUMMY, DUMMY]
    assert blocks.block_groups.tolist() == [0, 0, 0, 1, 3, 3]
    assert blocks.block_mapping.tolist() == [
        [1, 0, 0],
        [1, 0, 0],
        [1, 0, 0],
        [0, 1, 0],
        [0, 0, 0],
        [0, 0, 0],
    ]
    usage = (blocks.block_bias == 0).sum(-1).tolist()
    assert usage == [4, 4, 1, 2, 1, 1]
    assert meta.slot_mapping[:2].tolist() == [32, 25]
    assert _in_dummy(meta.slot_mapping[2:])


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: build_decode_metadata([SeqLayout([1, 2], 4, 1)], 1, 1, CACHE),
            "2 blocks",
        ),
        (
            lambda: build_prompt_metadata([SeqLayout([1, 2], 5, 1)], 1, 2, 1, CACHE),
            "2 blocks",
        ),
        (
            lambda: build_decode_metadata([SeqLayout([1], 0, 1)] * 2, 1, 4, CACHE),
            "batch size",
        ),
    ],
)
def test_metadata_refuses_buckets_too_small(build, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        build()


def test_metadata_decode_layout_per_window() -> None:
    # Windowed and global layers in one model (Gemma 2): the full layout keeps
    # every block; a window of 5 reads only the blocks holding the last 5 keys.
    cache = CacheGeometry(4, DUMMY, torch.float32, torch.device("cpu"), (5,), True)
    seqs = [SeqLayout([4, 0, 8], 8, 1), SeqLayout([6], 1, 1)]  # seq_lens 9 and 2
    meta = build_decode_metadata(seqs, 3, 6, cache)
    assert meta.decode_blocks().block_list.tolist() == [4, 0, 8, 6, DUMMY, DUMMY]
    windowed = meta.decode_blocks(5)
    # Keys 4..8 of row 0 sit in its blocks 1 and 2; capacity min(6, 3 * 3).
    assert windowed.block_list.tolist() == [0, 8, 6, DUMMY, DUMMY, DUMMY]
    visible = (windowed.block_bias == 0).int().tolist()
    assert visible[:3] == [[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]]
    assert windowed.block_offsets.tolist()[:3] == [-4, 0, -1]


def test_metadata_decode_layout_per_chunk() -> None:
    # Llama 4's chunked layers beside global ones: a chunk of 6 reads only the
    # blocks from the start of the decode token's chunk (position 6 for row 0's
    # token at 8, position 0 for row 1's at 1).
    cache = CacheGeometry(
        4, DUMMY, torch.float32, torch.device("cpu"), attention_chunks=(6,)
    )
    seqs = [SeqLayout([4, 0, 8], 8, 1), SeqLayout([6], 1, 1)]
    meta = build_decode_metadata(seqs, 3, 6, cache)
    assert meta.decode_blocks().block_list.tolist() == [4, 0, 8, 6, DUMMY, DUMMY]
    chunked = meta.decode_blocks(None, 6)
    assert chunked.block_list.tolist() == [0, 8, 6, DUMMY, DUMMY, DUMMY]
    visible = (chunked.block_bias == 0).int().tolist()
    assert visible[:3] == [[0, 0, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]]


def test_metadata_prompt_chunk_mask() -> None:
    # Two cached tokens, three new ones at positions 2, 3, 4: position 2 ends
    # the chunk [0, 3), positions 3 and 4 start the next (a chunked layer's
    # bias, made from the pass's one mask).
    meta = build_prompt_metadata([SeqLayout([3, 5], 2, 3)], 1, 3, 1, CACHE)
    assert _visible(meta, chunk=3)[0] == [
        [1, 1, 0, 0, 1, 0, 0],
        [0, 0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 1, 1],
    ]


def test_metadata_prompt_window_mask() -> None:
    cache = CacheGeometry(4, DUMMY, torch.float32, torch.device("cpu"), (2,), True)
    # Two cached tokens, three new ones: query t (position 2 + t) sees keys
    # at positions 1 + t and 2 + t only.
    meta = build_prompt_metadata([SeqLayout([3, 5], 2, 3)], 1, 3, 1, cache)
    assert _visible(meta, 2)[0] == [
        [0, 1, 0, 0, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 1, 1],
    ]
    assert meta.prompt_mask is not None
    assert meta.prompt_mask.key_position.tolist() == [[0, 1, 2, 3, 2, 3, 4]]


def test_metadata_prompt_span_sees_both_ways() -> None:
    # Two cached tokens (positions 0, 1), four new ones (2..5); positions 1..3
    # are one bidirectional span (an image begun in the cached context): the
    # span's new queries see up to position 3, the others stay causal. The
    # window of 3 still hides position 0 from position 3 and later.
    seqs = [SeqLayout([3, 5], 2, 4, bidirectional_spans=((1, 3),))]
    meta = build_prompt_metadata(seqs, 2, 4, 1, CACHE)
    rows = [
        [1, 1, 0, 0, 1, 1, 0, 0],
        [1, 1, 0, 0, 1, 1, 0, 0],
        [1, 1, 0, 0, 1, 1, 1, 0],
        [1, 1, 0, 0, 1, 1, 1, 1],
    ]
    assert _visible(meta)[0] == rows
    assert _visible(meta, 3)[0] == [
        [1, 1, 0, 0, 1, 1, 0, 0],
        [0, 1, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 1, 1, 1],
    ]
    # The span-free row of the pass is as causal as without spans.
    assert _visible(meta)[1] == [
        [0] * 4 + [int(k == t) for k in range(4)] for t in range(4)
    ]
    assert meta.prompt_mask is not None
    assert not PromptBias(meta.prompt_mask, torch.float32).causal  # no tile skipped


def test_metadata_prompt_without_spans_has_no_span_ends() -> None:
    meta = build_prompt_metadata([SeqLayout([3, 5], 2, 4)], 1, 4, 1, CACHE)
    assert meta.prompt_mask is not None and meta.prompt_mask.query_span_end is None


def test_metadata_span_ends_in_every_pass_when_the_cache_asks() -> None:
    # A model with bidirectional spans: a span-free pass still carries span
    # ends (each query's own position), so compiled graphs see one structure.
    meta = build_prompt_metadata(
        [SeqLayout([3, 5], 2, 2)], 1, 4, 1, CACHE.with_span_ends()
    )
    assert meta.prompt_mask is not None
    assert meta.prompt_mask.query_span_end is not None
    assert meta.prompt_mask.query_span_end.tolist() == [[2, 3, 2, 3]]
    assert _visible(meta) == _visible(
        build_prompt_metadata([SeqLayout([3, 5], 2, 2)], 1, 4, 1, CACHE)
    )


def test_image_spans_in_the_windowed_layers_only_when_they_clamp() -> None:
    """Gemma 4 (its windowed layers marked mm_prefix_clamp_sliding_window, as
    vLLM builds them): every span is kept, longer than the window too, and the
    unmarked layers attend causally; Gemma 3 (none marked): spans longer than
    the window stay causal, in every layer."""
    config: Any = SimpleNamespace(hf_text_config=SimpleNamespace(sliding_window=3))
    layers = [
        SimpleNamespace(impl=SimpleNamespace(image_spans=True), **{CLAMPS: marked})
        for marked in (True, False)
    ]
    assert image_spans(config, layers) == ImageSpans(None)
    assert [layer.impl.image_spans for layer in layers] == [True, False]
    unmarked = [SimpleNamespace(impl=SimpleNamespace(image_spans=True))]
    assert image_spans(config, unmarked) == ImageSpans(3)
    assert unmarked[0].impl.image_spans


def test_metadata_span_longer_than_the_window_ends_at_the_window() -> None:
    # Positions 0..4 one span, a window of 3 (transformers' Gemma 4: causal or
    # the same image, and at most 2 positions back): span queries see to
    # position 4, none further back than the window.
    seqs = [SeqLayout([0, 1], 0, 6, bidirectional_spans=((0, 4),))]
    meta = build_prompt_metadata(seqs, 1, 8, 0, CACHE)
    assert _visible(meta, 3)[0][:6] == [
        [1, 1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0, 0],
        [0, 1, 1, 1, 1, 0, 0, 0],
        [0, 0, 1, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 1, 1, 0, 0],
    ]
