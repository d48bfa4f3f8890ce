"""Step 2 of planning: a step's prompt chunks grouped into passes, packed
(merged prefill, the default) or one row per chunk (``VLLM_HPU_MERGED_PREFILL=
false`` and pooling models, chosen at start-up in ``BucketingConfig``). The
bucket manager is only asked which warmed-up bucket would cover a group; the
passes themselves are built in ``build.py``."""

from vllm_hpu.bucketing import HpuBucketManager
from vllm_hpu.worker.passes.seqs import ScheduledSeq, cdiv, context_blocks
from vllm_hpu.worker.passes.shapes import pass_shape


def split_prompt_passes(
    seqs: list[ScheduledSeq],
    max_num_tokens: int,
    buckets: HpuBucketManager,
    block_size: int,
) -> list[list[ScheduledSeq]]:
    """The step's prompt passes, packed or one row per chunk."""
    if buckets.config.merged_prefill:
        return split_merged(seqs, buckets, block_size)
    return split_prefills(seqs, max_num_tokens, buckets, block_size)


def split_merged(
    seqs: list[ScheduledSeq], buckets: HpuBucketManager, block_size: int
) -> list[list[ScheduledSeq]]:
    """Packs, first fit: a chunk joins the first pack that still has a warmed-up
    bucket with it (the step's tokens always fit one; context may not). A chunk
    reading blocks another chunk of its pack writes is fine: every layer writes
    the pass's KV before it gathers context."""
    packs: list[list[ScheduledSeq]] = []
    for seq in seqs:
        for pack in packs:
            if buckets.has_prompt_bucket(*pass_shape([*pack, seq], True, block_size)):
                pack.append(seq)
                break
        else:
            packs.append([seq])
    return packs


def _prompt_tokens(
    seqs: list[ScheduledSeq], buckets: HpuBucketManager, block_size: int
) -> int:
    """Tokens ``seqs`` run as in one unpacked prompt pass, padded to its bucket."""
    bucket = buckets.covering_prompt_bucket(*pass_shape(seqs, False, block_size))
    return bucket.batch_size * bucket.query_len


def _dependency_depths(seqs: list[ScheduledSeq], block_size: int) -> list[int]:
    """How many passes must run before each chunk.

    vLLM can hand a prompt, as cached context, full blocks that another prompt
    scheduled in the same step writes (identical prefixes arriving together): the
    reader must run in a later pass than the writer. One pass is fine too, since
    every layer writes the pass's KV before reading context, but reordering chunks
    by length must not put a reader first.
    """
    writers: dict[int, int] = {}
    for index, seq in enumerate(seqs):
        for table in seq.tables:  # a full layer may read what a window skips
            for block in table[seq.start // block_size : cdiv(seq.end, block_size)]:
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
    seqs: list[ScheduledSeq],
    max_num_tokens: int,
    buckets: HpuBucketManager,
    block_size: int,
) -> list[list[ScheduledSeq]]:
    """Group prompt chunks into passes of similar length.

    Chunks are taken shortest first (then least cached context), after every chunk
    whose cached context they read is written (see ``_dependency_depths``). The
    next chunk joins the current pass unless rows x longest chunk would exceed the
    token budget (vLLM bounds only the sum of real tokens; prompt buckets are
    generated for batches within this bound, so every pass finds a warmed-up
    bucket), or has no warmed-up bucket (a bucket set need not have every batch
    size), or unless the joined pass would be padded to more tokens than the two
    passes apart, counting starting a pass as one block of tokens (the smallest
    prompt bucket by default): a long chunk must not stretch every short row.
    """
    depths = _dependency_depths(seqs, block_size)
    batches: list[list[ScheduledSeq]] = []
    for level in sorted(set(depths)):
        ready = [seq for seq, d in zip(seqs, depths, strict=True) if d == level]
        batches += _group_by_length(ready, max_num_tokens, buckets, block_size)
    return batches


def _group_by_length(
    seqs: list[ScheduledSeq],
    max_num_tokens: int,
    buckets: HpuBucketManager,
    block_size: int,
) -> list[list[ScheduledSeq]]:
    batches: list[list[ScheduledSeq]] = []
    current: list[ScheduledSeq] = []
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
