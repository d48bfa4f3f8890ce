"""hpu::rotary_pos_embedding(input, sin, cos, position_ids, offset, mode).

mode 0 (BLOCKWISE) rotates halves, GPT-NeoX style: x * cos + rotate_half(x) *
sin; mode 1 (PAIRWISE) rotates interleaved pairs, GPT-J style (bridge v1.19.0
hpex/kernels/RotaryPosEmbeddingHelper.py:64-85). cos and sin broadcast against
the input; with ``position_ids`` they are first gathered by position (HF's
``cos[position_ids].unsqueeze(1)``), else an ``offset`` skips that many positions.
"""

from typing import Any

import torch

from habana_frameworks.torch._double.ops import define, host, to_device

SCHEMA = (
    "rotary_pos_embedding(Tensor input, Tensor sin, Tensor cos, Tensor? position_ids, "
    "int offset, int mode) -> Tensor"
)
BLOCKWISE, PAIRWISE = 0, 1


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def _rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    even, odd = x[..., ::2], x[..., 1::2]
    return torch.stack((-odd, even), dim=-1).flatten(-2)


def _positioned(
    table: torch.Tensor, x: torch.Tensor, position_ids: Any, offset: int
) -> torch.Tensor:
    if position_ids is not None:
        return table[position_ids.long()].unsqueeze(1)
    if offset:
        return table[..., offset : offset + x.shape[-2], :]
    return table


def rotary_pos_embedding(
    input: torch.Tensor,
    sin: torch.Tensor,
    cos: torch.Tensor,
    position_ids: torch.Tensor | None,
    offset: int,
    mode: int,
) -> torch.Tensor:
    if mode not in (BLOCKWISE, PAIRWISE):
        raise RuntimeError(f"rotary_pos_embedding: unknown mode {mode}")
    x = host(input)
    positions = host(position_ids)
    cos_x = _positioned(host(cos), x, positions, offset)
    sin_x = _positioned(host(sin), x, positions, offset)
    rotate = _rotate_half if mode == BLOCKWISE else _rotate_every_two
    out = x.float() * cos_x.float() + rotate(x.float()) * sin_x.float()
    return to_device(out.to(input.dtype))


def _fake(input: torch.Tensor, *args: Any) -> torch.Tensor:
    return torch.empty_like(input)


def register() -> None:
    define(SCHEMA, rotary_pos_embedding, _fake)
