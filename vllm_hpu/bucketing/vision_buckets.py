"""Encoder passes of dynamic-resolution vision towers (Qwen2-VL), bucketed by
images and patches: ``n`` images padded to ``B >= n`` and ``P`` patches with
synthetic zero images (``(1, m, m)`` grids, the last taking the rest), so the
tower sees ``P`` patches in ``B + 1`` images; attention stays per image."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from vllm.multimodal.inputs import MultiModalKwargsItem

MIN_PATCH_BUCKET = 16
# The tensor of patches, per modality (vLLM's Qwen2-VL family names).
PIXEL_KEYS = {"image": "pixel_values", "video": "pixel_values_videos"}


def grid_key(modality: str) -> str:
    return f"{modality}_grid_thw"


def is_grid_item(modality: str, item: MultiModalKwargsItem) -> bool:
    """Whether ``item`` holds a dynamic-resolution tower's patches."""
    return grid_key(modality) in item and PIXEL_KEYS.get(modality) in item


def item_patches(modality: str, item: MultiModalKwargsItem) -> int:
    grid = item[grid_key(modality)].data
    assert isinstance(grid, torch.Tensor)
    return int(grid.prod())


def patch_buckets(smallest: int, largest: int) -> list[int]:
    """Powers of two from ``smallest`` to the first that holds ``largest``."""
    buckets = [max(MIN_PATCH_BUCKET, smallest)]
    while buckets[-1] < largest:
        buckets.append(buckets[-1] * 2)
    return buckets


@dataclass(frozen=True)
class PatchBuckets:
    """The (images, patches) shapes of a dynamic-resolution tower's passes."""

    batch_sizes: list[int]  # images per pass
    patches: list[int]  # patches per pass
    merge_area: int  # patches per output token (m * m)
    max_item_patches: int

    @classmethod
    def from_budget(
        cls,
        batch_sizes: list[int],
        max_item_patches: int,
        max_item_tokens: int,
        max_tokens_per_pass: int,
    ) -> "PatchBuckets":
        """Buckets up to what one step may encode: ``max_tokens_per_pass`` output
        tokens (vLLM's encoder compute budget) plus the padding images."""
        merge_area = max_item_patches // max_item_tokens
        most = max(max_tokens_per_pass, max_item_tokens) * merge_area
        largest = most + (batch_sizes[-1] + 1) * merge_area
        buckets = patch_buckets(2 * merge_area, largest)
        return cls(batch_sizes, buckets, merge_area, max_item_patches)

    def padding(self, num_items: int, batch_size: int) -> int:
        """The fewest patches the padding images of a pass take."""
        return (batch_size - num_items + 1) * self.merge_area

    def batch_size(self, num_items: int) -> int:
        return next(s for s in self.batch_sizes if s >= num_items)

    def fits(self, num_items: int, num_patches: int) -> bool:
        """Whether one pass can hold these images."""
        if num_items > self.batch_sizes[-1]:
            return False
        padding = self.padding(num_items, self.batch_size(num_items))
        return num_patches + padding <= self.patches[-1]

    def shape(self, num_items: int, num_patches: int) -> tuple[int, int]:
        """(images, patches) of the pass holding these images."""
        batch_size = self.batch_size(num_items)
        needed = num_patches + self.padding(num_items, batch_size)
        assert needed <= self.patches[-1], "group_by_patches keeps passes in range"
        return batch_size, self._bucket(needed)

    def warmup_shapes(self) -> list[tuple[int, int]]:
        """Every shape a pass can take: ``B`` images need from ``(B + 1) m * m``
        patches (one-token images and padding) to ``B`` of the largest size."""
        shapes = []
        for size in self.batch_sizes:
            least = (size + 1) * self.merge_area
            most = size * self.max_item_patches + self.merge_area
            if least > self.patches[-1]:
                continue
            low, high = self._bucket(least), self._bucket(most)
            shapes += [(size, p) for p in self.patches if low <= p <= high]
        return shapes

    def _bucket(self, num_patches: int) -> int:
        """The smallest patch bucket holding ``num_patches``, else the largest."""
        return next((p for p in self.patches if p >= num_patches), self.patches[-1])

    def empty(self, kwargs: dict[str, Any], modality: str) -> dict[str, Any]:
        """Batched encoder inputs with no image left (warmup pads them up)."""
        pixels_key, key = PIXEL_KEYS[modality], grid_key(modality)
        return {**kwargs, key: kwargs[key][:0], pixels_key: kwargs[pixels_key][:0]}

    def pad(
        self, kwargs: dict[str, Any], modality: str, shape: tuple[int, int]
    ) -> dict[str, Any]:
        """Batched encoder inputs of ``n`` images padded to ``shape``."""
        batch_size, num_patches = shape
        pixels_key, key = PIXEL_KEYS[modality], grid_key(modality)
        grids: torch.Tensor = kwargs[key]
        pixels: torch.Tensor = kwargs[pixels_key]
        side = _side(self.merge_area)
        pads = [(1, side, side)] * (batch_size - len(grids))
        rest = num_patches - pixels.shape[0] - len(pads) * self.merge_area
        assert rest >= self.merge_area and rest % self.merge_area == 0, (shape, rest)
        pads.append((1, side, rest // side))
        pad_grids = torch.tensor(pads, dtype=grids.dtype, device=grids.device)
        pad_pixels = pixels.new_zeros((num_patches - pixels.shape[0], pixels.shape[1]))
        return {
            **kwargs,
            key: torch.cat([grids, pad_grids]),
            pixels_key: torch.cat([pixels, pad_pixels]),
        }


def _side(merge_area: int) -> int:
    side = round(merge_area**0.5)
    assert side * side == merge_area, merge_area
    return side


def group_by_patches(
    buckets: PatchBuckets, patches: Sequence[int]
) -> list[tuple[int, int]]:
    """Consecutive [start, end) runs of items, each fitting one pass."""
    runs: list[tuple[int, int]] = []
    start = 0
    while start < len(patches):
        end = start + 1
        while end < len(patches) and buckets.fits(
            end + 1 - start, sum(patches[start : end + 1])
        ):
            end += 1
        runs.append((start, end))
        start = end
    return runs
