"""Replay a step-shape trace against a bucket set with the runner's own pass
split, so passes, padding and misses are what serving would see."""

import dataclasses
import math
from collections.abc import Iterable

from vllm_hpu.attention.metadata import SeqLayout
from vllm_hpu.bucketing.manager import HpuBucketManager
from vllm_hpu.bucketing.padding import PaddingCounter, PaddingStats
from vllm_hpu.bucketing.prompt_passes import (
    context_blocks,
    pass_shape,
    split_prompt_passes,
)
from vllm_hpu.bucketing.trace import StepShape, StepTrace


@dataclasses.dataclass
class ReplayResult:
    """Padding and pass counts of a trace replayed against one bucket set."""

    stats: PaddingStats = dataclasses.field(default_factory=PaddingStats)
    # Cached-context blocks of prompt passes (attention only, so reported apart).
    context_blocks: PaddingCounter = dataclasses.field(default_factory=PaddingCounter)
    steps: int = 0
    passes: int = 0
    # The most passes any one step needed.
    max_passes: int = 0
    misses: int = 0

    @property
    def passes_per_step(self) -> float:
        return self.passes / self.steps if self.steps else 0.0


@dataclasses.dataclass(frozen=True)
class _TraceChunk:
    """A recorded prompt chunk, as the split sees the runner's."""

    layout: SeqLayout

    @property
    def tables(self) -> tuple[list[int], ...]:
        return (self.layout.block_table,)


def _prompt_chunks(step: StepShape, block_size: int) -> list[_TraceChunk]:
    """The step's prompt chunks; distinct blocks per request, so no chunk reads
    what another writes (a trace does not record sharing)."""
    seqs, next_block = [], 0
    for chunk in step.prompts:
        num_blocks = math.ceil(
            (chunk.num_computed_tokens + chunk.query_len) / block_size
        )
        table = list(range(next_block, next_block + num_blocks))
        next_block += num_blocks
        layout = SeqLayout(table, chunk.num_computed_tokens, chunk.query_len)
        seqs.append(_TraceChunk(layout))
    return seqs


def replay_step(
    step: StepShape, manager: HpuBucketManager, result: ReplayResult
) -> None:
    """Plan one step's passes as the runner does, pad them, count into ``result``."""
    config = manager.config
    seqs = _prompt_chunks(step, config.block_size)
    batches = split_prompt_passes(
        seqs, config.max_num_batched_tokens, manager, config.block_size
    )
    for batch in batches:
        contexts = [context_blocks(s, config.block_size) for s in batch]
        bucket = manager.find_prompt_bucket(
            *pass_shape(batch, config.merged_prefill, config.block_size)
        )
        result.stats.record_prompt(
            bucket, [s.layout.num_scheduled_tokens for s in batch]
        )
        result.context_blocks.add(sum(contexts), bucket.batch_size * bucket.num_blocks)
    num_passes = len(batches)
    if step.decode_blocks:
        num_blocks = sum(step.decode_blocks)
        bucket = manager.find_decode_bucket(len(step.decode_blocks), num_blocks)
        result.stats.record_decode(bucket, len(step.decode_blocks), num_blocks)
        num_passes += 1
    result.steps += 1
    result.passes += num_passes
    result.max_passes = max(result.max_passes, num_passes)


def replay(steps: Iterable[StepShape], manager: HpuBucketManager) -> ReplayResult:
    """Pad every step to ``manager``'s buckets; a miss is counted, not warned."""
    result = ReplayResult()
    misses_before = sum(manager.misses.values())
    for step in steps:
        if step.prompts or step.decode_blocks:
            replay_step(step, manager, result)
    result.misses = sum(manager.misses.values()) - misses_before
    return result


def replay_trace(trace: StepTrace, manager: HpuBucketManager) -> ReplayResult:
    return replay(trace.steps, manager)
