"""Encoder passes of tiled vision towers (Llama 4), bucketed by tiles per pass:
``T`` tiles (grid plus global tile per image) padded to ``B >= T`` with one
synthetic zero-tile image, whose output is dropped."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from vllm.multimodal.inputs import MultiModalKwargsItem

PIXELS_KEY = "pixel_values"
TILES_KEY = "patches_per_image"
ASPECT_RATIOS_KEY = "aspect_ratios"  # (rows, columns) of tiles, per image


def is_tiled_item(modality: str, item: MultiModalKwargsItem) -> bool:
    """Whether ``item`` is an image of a tiled tower (Llama 4's inputs)."""
    return modality == "image" and TILES_KEY in item and PIXELS_KEY in item


def item_tiles(item: MultiModalKwargsItem) -> int:
    tiles = item[TILES_KEY].data
    assert isinstance(tiles, torch.Tensor)
    return int(tiles)


@dataclass(frozen=True)
class TileBuckets:
    """The tile counts of a tiled tower's passes: powers of two."""

    tiles: list[int]

    @classmethod
    def from_budget(
        cls, max_item_tiles: int, max_item_tokens: int, max_tokens_per_pass: int
    ) -> "TileBuckets":
        """Buckets up to the tiles one step may encode (``max_tokens_per_pass``, vLLM's
        encoder budget in image tokens), and at least the largest image's."""
        tokens_per_tile = max(max_item_tokens // max_item_tiles, 1)
        most = max(max_item_tiles, -(-max_tokens_per_pass // tokens_per_tile))
        tiles = [1]
        while tiles[-1] < most:
            tiles.append(tiles[-1] * 2)
        return cls(tiles)

    def bucket(self, num_tiles: int) -> int:
        """The smallest bucket holding ``num_tiles``."""
        return next(b for b in self.tiles if b >= num_tiles)

    def warmup_shapes(self) -> list[int]:
        return list(self.tiles)

    def group(self, tiles: Sequence[int]) -> list[tuple[int, int]]:
        """Consecutive [start, end) runs of images, each fitting one pass."""
        runs: list[tuple[int, int]] = []
        start = 0
        while start < len(tiles):
            end, total = start + 1, tiles[start]
            while end < len(tiles) and total + tiles[end] <= self.tiles[-1]:
                total += tiles[end]
                end += 1
            runs.append((start, end))
            start = end
        return runs

    def pad(self, kwargs: dict[str, Any], num_tiles: int) -> dict[str, Any]:
        """Batched encoder inputs padded to ``num_tiles`` by one image of zero tiles."""
        pixels: torch.Tensor = kwargs[PIXELS_KEY]
        rest = num_tiles - pixels.shape[0]
        assert rest >= 0, (num_tiles, pixels.shape)
        if rest == 0:
            return kwargs
        counts: torch.Tensor = kwargs[TILES_KEY]
        ratios: torch.Tensor = kwargs[ASPECT_RATIOS_KEY]
        return {
            **kwargs,
            PIXELS_KEY: torch.cat([pixels, pixels.new_zeros(rest, *pixels.shape[1:])]),
            TILES_KEY: torch.cat([counts, counts.new_tensor([rest])]),
            ASPECT_RATIOS_KEY: torch.cat([ratios, ratios.new_tensor([[1, rest]])]),
        }

    @staticmethod
    def empty(kwargs: dict[str, Any]) -> dict[str, Any]:
        """Batched encoder inputs with no image left (warmup pads them up)."""
        keys = (PIXELS_KEY, TILES_KEY, ASPECT_RATIOS_KEY)
        return {**kwargs, **{key: kwargs[key][:0] for key in keys}}
