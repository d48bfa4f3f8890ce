"""How a step's prompt chunks become bucketed passes: the shape a pass pads up to
(rows, query length, context blocks), and which chunks share a pass, packed
(merged prefill, the default) or one row per chunk. The runner's planner and
the trace replay (``replay.py``) both split this way."""

from collections.abc import Sequence
from typing import Protocol, TypeVar

from vllm.utils.math_utils import cdiv

from vllm_hpu.attention.merged_metadata import packed_context_blocks, packed_tokens
from vllm_hpu.attention.metadata import SeqLayout
from vllm_hpu.bucketing.manager import HpuBucketManager


class SplitChunk(Protocol):
    """A prompt chunk as the split sees it."""

    @property
    def layout(self) -> SeqLayout: ...  # with the first KV cache group's table

    @property
    def tables(self) -> tuple[list[int], ...]: ...  # every group's block table


Chunk = TypeVar("Chunk", bound=SplitChunk)


def context_blocks(chunk: SplitChunk, block_size: int) -> int:
    return cdiv(chunk.layout.num_computed_tokens, block_size)


def pass_shape(
    seqs: Sequence[SplitChunk], merged: bool, block_size: int
) -> tuple[int, int, int]:
    """(rows, query length, context blocks) a prompt pass over ``seqs`` pads up."""
    if merged:
        layouts = [s.layout for s in seqs]
        return 1, packed_tokens(layouts), packed_context_blocks(layouts, block_size)
    return (
        len(seqs),
        max(s.layout.num_scheduled_tokens for s in seqs),
        max(context_blocks(s, block_size) for s in seqs),
    )


def split_prompt_passes(
    seqs: list[Chunk],
    max_num_tokens: int,
    buckets: HpuBucketManager,
    block_size: int,
) -> list[list[Chunk]]:
    """The step's prompt passes, packed or one row per chunk."""
    if buckets.config.merged_prefill:
        return split_merged(seqs, buckets, block_size)
    return split_prefills(seqs, max_num_tokens, buckets, block_size)


def split_merged(
    seqs: list[Chunk], buckets: HpuBucketManager, block_size: int
) -> list[list[Chunk]]:
    """Packs, first fit, into the first pack with a warmed-up bucket. A chunk may read
    blocks its pack writes: every layer writes KV before it gathers context."""
    packs: list[list[Chunk]] = []
    for seq in seqs:
        for pack in packs:
            if buckets.has_prompt_bucket(*pass_shape([*pack, seq], True, block_size)):
                pack.append(seq)
                break
        else:
            packs.append([seq])
    return packs


def _prompt_tokens(
    seqs: Sequence[SplitChunk], buckets: HpuBucketManager, block_size: int
) -> int:
    """Tokens ``seqs`` run as in one unpacked prompt pass, padded to its bucket."""
    bucket = buckets.covering_prompt_bucket(*pass_shape(seqs, False, block_size))
    return bucket.batch_size * bucket.query_len


def _dependency_depths(seqs: Sequence[SplitChunk], block_size: int) -> list[int]:
    """Passes that must run before each chunk: a prompt's cached context may be blocks
    another prompt of the step writes (same prefixes): readers follow writers."""
    writers: dict[int, int] = {}
    for index, seq in enumerate(seqs):
        for table in seq.tables:  # a full layer may read what a window skips
            first = seq.layout.num_computed_tokens // block_size
            for block in table[first : cdiv(_end(seq), block_size)]:
                writers[block] = index
    depths: dict[int, int] = {}

    def depth(index: int) -> int:
        if index not in depths:
            seq = seqs[index]
            num_context = context_blocks(seq, block_size)
            context = {b for table in seq.tables for b in table[:num_context]}
            sources = {writers.get(block, index) for block in context} - {index}
            depths[index] = max((depth(w) + 1 for w in sources), default=0)
        return depths[index]

    return [depth(index) for index in range(len(seqs))]


def split_prefills(
    seqs: list[Chunk],
    max_num_tokens: int,
    buckets: HpuBucketManager,
    block_size: int,
) -> list[list[Chunk]]:
    """Group prompt chunks into passes of similar length, shortest first (then least
    context), after the chunks whose context they read. A chunk joins the pass
    unless rows x longest chunk passes the token budget, no warmed bucket fits, or
    it would pad to more tokens than two passes (a pass start counting a block)."""
    depths = _dependency_depths(seqs, block_size)
    batches: list[list[Chunk]] = []
    for level in sorted(set(depths)):
        ready = [seq for seq, d in zip(seqs, depths, strict=True) if d == level]
        batches += _group_by_length(ready, max_num_tokens, buckets, block_size)
    return batches


def _group_by_length(
    seqs: list[Chunk],
    max_num_tokens: int,
    buckets: HpuBucketManager,
    block_size: int,
) -> list[list[Chunk]]:
    batches: list[list[Chunk]] = []
    current: list[Chunk] = []
    by_length = sorted(
        seqs,
        key=lambda s: (s.layout.num_scheduled_tokens, s.layout.num_computed_tokens),
    )
    for seq in by_length:
        joined = [*current, seq]
        if current and (
            len(joined) * seq.layout.num_scheduled_tokens > max_num_tokens
            or not buckets.has_prompt_bucket(*pass_shape(joined, False, block_size))
            or _prompt_tokens(joined, buckets, block_size)
            > _prompt_tokens(current, buckets, block_size)
            + _prompt_tokens([seq], buckets, block_size)
            + block_size
        ):
            batches.append(current)
            joined = [seq]
        current = joined
    if current:
        batches.append(current)
    return batches


def _end(chunk: SplitChunk) -> int:
    return chunk.layout.num_computed_tokens + chunk.layout.num_scheduled_tokens
