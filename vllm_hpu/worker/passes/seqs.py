"""Step 1 of planning: the scheduler's output as one ``ScheduledSeq`` per batch
row (its block table, cached context and scheduled tokens), split into prompt
chunks and decodes."""

from collections.abc import Mapping
from dataclasses import dataclass

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

from vllm_hpu.attention.metadata import SeqLayout


@dataclass(frozen=True)
class ScheduledSeq:
    row: int  # the request's row in vLLM's InputBatch
    layout: SeqLayout

    @property
    def start(self) -> int:
        return self.layout.num_computed_tokens

    @property
    def end(self) -> int:
        return self.layout.num_computed_tokens + self.layout.num_scheduled_tokens


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def context_blocks(seq: ScheduledSeq, block_size: int) -> int:
    return cdiv(seq.layout.num_computed_tokens, block_size)


def scheduled_seqs(
    scheduler_output: SchedulerOutput,
    input_batch: InputBatch,
    requests: Mapping[str, CachedRequestState],
) -> list[ScheduledSeq]:
    """Every batch row, in row order, with what this step computes of it."""
    seqs = []
    for row, req_id in enumerate(input_batch.req_ids):
        state = requests[req_id]
        layout = SeqLayout(
            block_table=state.block_ids[0],
            num_computed_tokens=state.num_computed_tokens,
            num_scheduled_tokens=scheduler_output.num_scheduled_tokens[req_id],
        )
        seqs.append(ScheduledSeq(row=row, layout=layout))
    return seqs


def split_by_phase(
    seqs: list[ScheduledSeq],
    min_prompt_tokens: int,
    drafted_rows: frozenset[int] = frozenset(),
) -> tuple[list[ScheduledSeq], list[ScheduledSeq]]:
    """(prompt chunks, decodes): a row scheduling fewer than
    ``min_prompt_tokens`` tokens decodes, and so does a row verifying drafts
    (``drafted_rows``: its last token and its drafts)."""

    def decodes(seq: ScheduledSeq) -> bool:
        return (
            seq.layout.num_scheduled_tokens < min_prompt_tokens
            or seq.row in drafted_rows
        )

    return [s for s in seqs if not decodes(s)], [s for s in seqs if decodes(s)]
