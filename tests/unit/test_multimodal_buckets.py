"""Encoder passes are bucketed by items per pass: powers of two up to the most
items vLLM schedules in one step; a dynamic-resolution tower's passes also by
patches, a tiled tower's (Llama 4) by tiles, and every pass lands on a shape
warmup runs."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from vllm_hpu.bucketing.tile_buckets import TileBuckets
from vllm_hpu.bucketing.vision_buckets import PatchBuckets, group_by_patches
from vllm_hpu.worker.capabilities.multimodal import encoder_batch_sizes


@pytest.mark.parametrize(
    ("max_items", "expected"),
    [(1, [1]), (2, [1, 2]), (5, [1, 2, 4, 5]), (8, [1, 2, 4, 8])],
)
def test_encoder_batch_sizes(max_items: int, expected: list[int]) -> None:
    assert encoder_batch_sizes(max_items) == expected


# ---- dynamic resolution (Qwen2-VL): images and patches per pass ---------------

MERGE_AREA = 4  # 2 x 2 patches per image token
MAX_ITEM_PATCHES = 64  # 16 tokens: the tiny Qwen2-VL's largest image


def _patch_buckets(max_items: int, max_tokens_per_pass: int) -> PatchBuckets:
    return PatchBuckets.from_budget(
        encoder_batch_sizes(max_items),
        MAX_ITEM_PATCHES,
        MAX_ITEM_PATCHES // MERGE_AREA,
        max_tokens_per_pass,
    )


# Images of 1 to 16 tokens (2 x 2 patches each), up to what one step encodes.
image_patches = st.lists(
    st.integers(1, MAX_ITEM_PATCHES // MERGE_AREA).map(lambda t: t * MERGE_AREA),
    min_size=1,
    max_size=12,
)


@given(patches=image_patches, max_items=st.integers(1, 8))
def test_every_pass_of_images_has_a_warmed_up_shape(
    patches: list[int], max_items: int
) -> None:
    buckets = _patch_buckets(max_items, max_tokens_per_pass=64)
    warmed = set(buckets.warmup_shapes())
    runs = group_by_patches(buckets, patches)
    assert [i for start, end in runs for i in range(start, end)] == list(
        range(len(patches))
    )
    for start, end in runs:
        shape = buckets.shape(end - start, sum(patches[start:end]))
        assert shape in warmed, (patches[start:end], shape)


@given(patches=image_patches)
def test_padding_fills_the_bucket_with_whole_images(patches: list[int]) -> None:
    buckets = _patch_buckets(8, max_tokens_per_pass=256)
    patches = patches[:8]
    grids = torch.tensor([[1, 2, p // 2] for p in patches])
    pixels = torch.arange(sum(patches) * 3, dtype=torch.float32).reshape(-1, 3)
    kwargs = {"pixel_values": pixels, "image_grid_thw": grids}
    size, num_patches = buckets.shape(len(patches), sum(patches))
    padded = buckets.pad(kwargs, "image", (size, num_patches))
    padded_grids = padded["image_grid_thw"]
    assert len(padded_grids) == size + 1  # B images, at least one of them padding
    assert torch.equal(padded_grids[: len(patches)], grids)
    assert int(padded_grids.prod(-1).sum()) == num_patches
    assert (padded_grids[:, 1:] % 2 == 0).all()  # whole 2 x 2 merges
    assert torch.equal(padded["pixel_values"][: len(pixels)], pixels)
    assert padded["pixel_values"].shape == (num_patches, 3)


# ---- tiled images (Llama 4): tiles per pass ----------------------------------

MAX_ITEM_TILES = 5  # 4 x 1 tiles and the global one
TOKENS_PER_TILE = 4


@pytest.mark.parametrize(
    ("max_tokens_per_pass", "expected"),
    [(20, [1, 2, 4, 8]), (64, [1, 2, 4, 8, 16]), (65, [1, 2, 4, 8, 16, 32])],
)
def test_tile_buckets_hold_what_one_step_encodes(
    max_tokens_per_pass: int, expected: list[int]
) -> None:
    buckets = TileBuckets.from_budget(
        MAX_ITEM_TILES, MAX_ITEM_TILES * TOKENS_PER_TILE, max_tokens_per_pass
    )
    assert buckets.tiles == expected


@given(tiles=st.lists(st.integers(1, MAX_ITEM_TILES), min_size=1, max_size=12))
def test_every_pass_of_tiles_is_a_warmed_up_bucket_padded_by_one_image(
    tiles: list[int],
) -> None:
    buckets = TileBuckets.from_budget(MAX_ITEM_TILES, 20, max_tokens_per_pass=32)
    runs = buckets.group(tiles)
    assert [i for start, end in runs for i in range(start, end)] == list(
        range(len(tiles))
    )
    for start, end in runs:
        counts = torch.tensor(tiles[start:end])
        pixels = torch.rand(int(counts.sum()), 3, 2, 2)
        kwargs = {
            "pixel_values": pixels,
            "patches_per_image": counts,
            "aspect_ratios": torch.ones(end - start, 2, dtype=torch.long),
        }
        num_tiles = buckets.bucket(len(pixels))
        assert num_tiles in buckets.warmup_shapes()
        padded = buckets.pad(kwargs, num_tiles)
        rest = num_tiles - len(pixels)
        assert padded["pixel_values"].shape == (num_tiles, 3, 2, 2)
        assert torch.equal(padded["pixel_values"][: len(pixels)], pixels)
        assert not padded["pixel_values"][len(pixels) :].any()
        expected_counts = tiles[start:end] + ([rest] if rest else [])
        assert padded["patches_per_image"].tolist() == expected_counts
        assert len(padded["aspect_ratios"]) == len(expected_counts)
