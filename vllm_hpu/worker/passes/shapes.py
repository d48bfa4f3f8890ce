"""The shape a prompt pass pads up to a bucket: (rows, query length, context
blocks), one row per chunk or, under merged prefill, every chunk packed into one
row (the packing's arithmetic is the merged metadata builder's own)."""

from vllm_hpu.attention.merged import packed_context_blocks, packed_tokens
from vllm_hpu.worker.passes.seqs import ScheduledSeq, context_blocks


def pass_shape(
    seqs: list[ScheduledSeq], merged: bool, block_size: int
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
