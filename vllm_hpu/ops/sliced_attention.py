"""Prompt attention cut into tiles of queries x keys and merged through each
tile's log-sum-exp (VLLM_HPU_FSDPA_SLICE_*), so memory follows the tile size,
not the square of the pass length; any kernel returning its softmax
statistics can run the tiles."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from vllm_hpu.ops.score_mods import with_sinks

# (query [bs, sq, H, D], key/value [bs, sk, KVH, D/Dv], bias [bs, 1 or H, sq, sk])
# -> (output [bs, sq, H, Dv] over the tile's keys, lse [bs, sq, H] fp32).
TileAttention = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    tuple[torch.Tensor, torch.Tensor],
]
# (queries, keys) -> the tile's additive bias [bs, 1 or H, sq, sk].
TileBias = Callable[[slice, slice], torch.Tensor]


@dataclass(frozen=True)
class PromptSlicing:
    """When a prompt pass is cut, and into what (plain numbers from envs)."""

    threshold: int  # passes attending at least this many keys are cut
    chunk_size: int  # queries and keys per tile

    def applies(self, num_keys: int) -> bool:
        return num_keys >= self.threshold


NO_SLICING = PromptSlicing(threshold=2**62, chunk_size=2**62)


class KeySource(Protocol):
    """The keys and values a pass attends: cached context first, then the
    current tokens. ``read`` is never asked for a range crossing ``past_len``."""

    @property
    def past_len(self) -> int: ...

    @property
    def num_keys(self) -> int: ...

    def read(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [start, end): [bs, end - start, KVH, D] each."""
        ...

    def whole(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every key and value of the pass: [bs, K, KVH, D] each."""
        ...


@dataclass(frozen=True)
class TileGrid:
    """Where a pass is cut: query tiles, and per query tile the key tiles it may
    see. Context and current keys are tiled apart; under a causal mask current
    keys after a tile's last query are skipped (half the work of a prompt)."""

    query_len: int
    past_len: int
    chunk_size: int
    causal: bool = True

    def query_tiles(self) -> list[slice]:
        return _cut(0, self.query_len, self.chunk_size)

    def key_tiles(self, queries: slice) -> list[slice]:
        current_end = queries.stop if self.causal else self.query_len
        past = _cut(0, self.past_len, self.chunk_size)
        current = _cut(self.past_len, self.past_len + current_end, self.chunk_size)
        return past + current


def _cut(start: int, end: int, size: int) -> list[slice]:
    return [slice(s, min(s + size, end)) for s in range(start, end, size)]


def merge_tiles(
    merged: tuple[torch.Tensor, torch.Tensor] | None,
    tile: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two partial attentions over disjoint keys -> the attention over both.
    Each is (output [..., H, Dv] fp32, log-sum-exp [..., H] fp32); each output is
    weighted by its share of the joint softmax, exp(lse - joint lse)."""
    if merged is None:
        return tile
    (out_a, lse_a), (out_b, lse_b) = merged, tile
    lse = torch.logaddexp(lse_a, lse_b)
    weight_a = torch.exp(lse_a - lse).unsqueeze(-1)
    weight_b = torch.exp(lse_b - lse).unsqueeze(-1)
    return out_a * weight_a + out_b * weight_b, lse


def sliced_attention(
    attend: TileAttention,
    query: torch.Tensor,
    keys: KeySource,
    bias: TileBias,
    grid: TileGrid,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """query: [bs, q, H, D] -> [bs, q, H, Dv] in query's dtype, tile by tile; sinks
    ([H], gpt-oss) join each query's merged softmax. The bias must hide keys with
    a finite value: -inf would give NaN for a tile where a query sees nothing."""
    outputs = []
    for queries in grid.query_tiles():
        merged = attend_tiles(
            attend, query[:, queries], keys.read, bias, queries, grid.key_tiles(queries)
        )
        outputs.append(with_sinks(*merged, sinks).to(query.dtype))
    return torch.cat(outputs, dim=1)


def attend_tiles(
    attend: TileAttention,
    query: torch.Tensor,
    read: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]],
    bias: TileBias,
    queries: slice,
    key_tiles: list[slice],
) -> tuple[torch.Tensor, torch.Tensor]:
    """One query tile [bs, sq, H, D] against ``key_tiles`` (at least one, in the
    pass's key positions; ``read(start, end)`` returns a range's keys and values)
    -> the merged (output [bs, sq, H, Dv], log-sum-exp [bs, sq, H]), fp32."""
    merged = None
    for key_range in key_tiles:
        key, value = read(key_range.start, key_range.stop)
        out, lse = attend(query, key, value, bias(queries, key_range))
        merged = merge_tiles(merged, (out.float(), lse.float()))
    assert merged is not None  # every query tile sees its own keys
    return merged
