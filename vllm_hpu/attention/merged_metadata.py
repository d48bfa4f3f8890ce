"""Metadata of a merged prompt pass: the step's prompt chunks packed into one
sequence ``[1, T]`` with their cached context blocks ``[1, C]`` (docs/bucketing.md,
"Merged prefill"). The attention ops see an ordinary one-row prompt pass whose
mask is block-diagonal: each chunk's owner is its index in the pack."""

import numpy as np
import torch
from vllm.utils.math_utils import cdiv

from vllm_hpu.attention.metadata import (
    CacheGeometry,
    HpuAttentionMetadata,
    PassRows,
    SeqLayout,
)
from vllm_hpu.ops.prompt_mask import NO_OWNER, PromptMask


def packed_context_blocks(seqs: list[SeqLayout], block_size: int) -> int:
    return sum(cdiv(seq.num_computed_tokens, block_size) for seq in seqs)


def packed_tokens(seqs: list[SeqLayout]) -> int:
    return sum(seq.num_scheduled_tokens for seq in seqs)


def _check_fits(
    seqs: list[SeqLayout], num_tokens: int, num_context_blocks: int, block_size: int
) -> None:
    tokens, blocks = packed_tokens(seqs), packed_context_blocks(seqs, block_size)
    if tokens > num_tokens or blocks > num_context_blocks:
        raise ValueError(
            f"a merged prompt pass of {tokens} tokens and {blocks} context blocks "
            f"does not fit the bucket ({num_tokens}, {num_context_blocks}); "
            "pick a larger bucket."
        )


class _Packing:
    """Per flat query and per context key: its prompt (owner) and position."""

    def __init__(self, seqs: list[SeqLayout], block_size: int) -> None:
        self.query_owner: list[int] = []
        self.query_position: list[int] = []
        self.query_span_end: list[int] = []
        self.context_owner: list[int] = []
        self.context_position: list[int] = []
        self.context_blocks: list[int] = []
        for owner, seq in enumerate(seqs):
            self._add(owner, seq, block_size)

    def _add(self, owner: int, seq: SeqLayout, block_size: int) -> None:
        start = seq.num_computed_tokens
        self.query_owner += [owner] * seq.num_scheduled_tokens
        self.query_position += range(start, start + seq.num_scheduled_tokens)
        self.query_span_end += seq.span_ends().tolist()
        num_blocks = cdiv(start, block_size)
        self.context_blocks += seq.block_table[:num_blocks]
        # Slots of a partly cached last block past the context are hidden.
        positions = range(num_blocks * block_size)
        self.context_owner += [owner if p < start else NO_OWNER for p in positions]
        self.context_position += positions


def _padded_tensor(values: list[int], length: int, fill: int) -> torch.Tensor:
    return torch.tensor(values + [fill] * (length - len(values)), dtype=torch.long)


def build_merged_prompt_metadata(
    seqs: list[SeqLayout],
    num_tokens: int,
    num_context_blocks: int,
    cache: CacheGeometry,
) -> HpuAttentionMetadata:
    """Metadata of one packed prompt pass of ``num_tokens`` (T) tokens over
    ``num_context_blocks`` (C) context blocks: mask [1, T] x [1, C*B + T] keys."""
    block_size, dummy = cache.block_size, cache.num_blocks
    _check_fits(seqs, num_tokens, num_context_blocks, block_size)
    packing = _Packing(seqs, block_size)
    past_len = num_context_blocks * block_size
    lengths = [seq.num_scheduled_tokens for seq in seqs]
    starts = np.cumsum([0, *lengths[:-1]]).tolist()
    query_owner = _padded_tensor(packing.query_owner, num_tokens, NO_OWNER)
    query_position = _padded_tensor(packing.query_position, num_tokens, 0)
    key_owner = torch.cat(
        (_padded_tensor(packing.context_owner, past_len, NO_OWNER), query_owner)
    )
    key_position = torch.cat(
        (_padded_tensor(packing.context_position, past_len, 0), query_position)
    )
    to_device = cache.device
    span_end = None
    if cache.span_ends or any(seq.bidirectional_spans for seq in seqs):
        span_end = _padded_tensor(packing.query_span_end, num_tokens, 0)[None]
        span_end = span_end.to(to_device)
    mask = PromptMask(
        query_owner=query_owner[None].to(to_device),
        query_position=query_position[None].to(to_device),
        key_owner=key_owner[None].to(to_device),
        key_position=key_position[None].to(to_device),
        query_span_end=span_end,
    )
    block_list = None
    if num_context_blocks > 0:
        blocks = _padded_tensor(packing.context_blocks, num_context_blocks, dummy)
        block_list = blocks.to(to_device)
    return HpuAttentionMetadata(
        is_prompt=True,
        slot_mapping=PassRows.of(seqs, starts).slot_mapping(num_tokens, cache),
        block_list=block_list,
        prompt_mask=mask,
        query_lens=torch.tensor([packed_tokens(seqs)]).to(to_device),
    )
