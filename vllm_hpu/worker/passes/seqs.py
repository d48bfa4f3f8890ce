"""Step 1 of planning: the scheduler's output as one ``ScheduledSeq`` per batch
row (its block table, cached context and scheduled tokens), split into prompt
chunks and decodes."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from vllm.config import ModelConfig
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

from vllm_hpu.attention.metadata import SeqLayout


@dataclass(frozen=True)
class ScheduledSeq:
    row: int  # the request's row in vLLM's InputBatch
    layout: SeqLayout  # with the block table of the first KV cache group
    # Every KV cache group's block table (hybrid KV cache manager: windowed
    # layers have their own); empty: every group reads ``layout.block_table``.
    block_tables: tuple[list[int], ...] = ()

    def group_layout(self, group: int) -> SeqLayout:
        """The layout with KV cache group ``group``'s block table."""
        if not self.block_tables:
            return self.layout
        return replace(self.layout, block_table=self.block_tables[group])

    @property
    def tables(self) -> tuple[list[int], ...]:
        """Every group's block table (block ids are unique across groups)."""
        return self.block_tables or (self.layout.block_table,)

    @property
    def start(self) -> int:
        return self.layout.num_computed_tokens

    @property
    def end(self) -> int:
        return self.layout.num_computed_tokens + self.layout.num_scheduled_tokens


@dataclass(frozen=True)
class ImageSpans:
    """vLLM's PrefixLM ranges (Gemma 3, 4): an item's tokens see each other both
    ways; as vLLM's GPU runner, spans longer than ``max_length`` stay causal."""

    max_length: int | None

    def spans(self, state: CachedRequestState) -> tuple[tuple[int, int], ...]:
        """(first, last) positions of the request's bidirectional spans."""
        spans: list[tuple[int, int]] = []
        for feature in state.mm_features:
            if feature.modality == "audio":
                continue
            for first, last in feature.mm_position.extract_embeds_range():
                if self.max_length is None or last - first < self.max_length:
                    spans.append((first, last))
        return tuple(spans)


def image_spans(model_config: ModelConfig, layers: Sequence[Any]) -> ImageSpans:
    """The spans of a model whose image tokens attend both ways. Where windowed
    layers bound them by their window (vLLM's mm_prefix_clamp_sliding_window:
    Gemma 4), every span is kept and the other layers attend causally: vLLM's
    Gemma 4 clears their spans itself, in metadata only vLLM's backends build."""
    clamps = [getattr(x, "mm_prefix_clamp_sliding_window", False) for x in layers]
    if not any(clamps):
        text_config = model_config.hf_text_config
        return ImageSpans(getattr(text_config, "sliding_window", None))
    for layer, clamped in zip(layers, clamps, strict=True):
        layer.impl.image_spans = clamped
    return ImageSpans(None)


def scheduled_seqs(
    scheduler_output: SchedulerOutput,
    input_batch: InputBatch,
    requests: Mapping[str, CachedRequestState],
    image_spans: ImageSpans | None = None,
) -> list[ScheduledSeq]:
    """Every batch row, in row order, with what this step computes of it."""
    seqs = []
    for row, req_id in enumerate(input_batch.req_ids):
        state = requests[req_id]
        layout = SeqLayout(
            block_table=state.block_ids[0],
            num_computed_tokens=state.num_computed_tokens,
            num_scheduled_tokens=scheduler_output.num_scheduled_tokens[req_id],
            bidirectional_spans=image_spans.spans(state) if image_spans else (),
        )
        tables = tuple(state.block_ids) if len(state.block_ids) > 1 else ()
        seqs.append(ScheduledSeq(row=row, layout=layout, block_tables=tables))
    return seqs


def split_by_phase(
    seqs: list[ScheduledSeq],
    min_prompt_tokens: int,
    drafted_rows: frozenset[int] = frozenset(),
) -> tuple[list[ScheduledSeq], list[ScheduledSeq]]:
    """(prompt chunks, decodes): rows scheduling < ``min_prompt_tokens`` tokens
    decode, as do rows verifying drafts (``drafted_rows``)."""

    def decodes(seq: ScheduledSeq) -> bool:
        return (
            seq.layout.num_scheduled_tokens < min_prompt_tokens
            or seq.row in drafted_rows
        )

    return [s for s in seqs if not decodes(s)], [s for s in seqs if decodes(s)]
