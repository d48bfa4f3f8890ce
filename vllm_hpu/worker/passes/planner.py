"""Planning a step's forward passes, one way: the scheduler's output -> scheduled
seqs (``seqs.py``) -> prompt groups (``bucketing/prompt_passes.py``) -> padded
passes with buckets and attention metadata (``build.py``); padding goes into
the bucket stats and, under ``VLLM_HPU_BUCKET_TRACE``, the step into a trace."""

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from vllm.config import VllmConfig
from vllm.utils.math_utils import cdiv
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

from vllm_hpu.attention.metadata import CacheGeometry
from vllm_hpu.bucketing import HpuBucketManager
from vllm_hpu.bucketing.prompt_passes import split_prompt_passes
from vllm_hpu.bucketing.trace import PromptChunk, StepShape, TraceRecorder
from vllm_hpu.envs import get_envs
from vllm_hpu.worker.passes.build import (
    build_decode_pass,
    build_prompt_forward,
    flat_blocks,
)
from vllm_hpu.worker.passes.forward_pass import ForwardPass
from vllm_hpu.worker.passes.seqs import (
    ImageSpans,
    ScheduledSeq,
    scheduled_seqs,
    split_by_phase,
)


@dataclass
class StepPlan:
    prompts: list[ForwardPass]  # prompt chunks in bucketed batches
    # One decode batch if any row decodes: a verification pass if any row verifies.
    decode: ForwardPass | None

    @property
    def passes(self) -> list[ForwardPass]:
        """In the order they run: prompts first, then the decode."""
        return self.prompts + ([self.decode] if self.decode is not None else [])


class PassPlanner:
    def __init__(
        self,
        input_batch: InputBatch,
        requests: Mapping[str, CachedRequestState],
        buckets: HpuBucketManager,
        vllm_config: VllmConfig,
    ) -> None:
        self.input_batch = input_batch
        self.requests = requests
        self.buckets = buckets
        self.block_size = vllm_config.cache_config.block_size
        self.max_num_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        # Pooling never decodes: a one-token prompt runs as a prompt pass.
        is_pooling = vllm_config.model_config.runner_type == "pooling"
        self.min_prompt_tokens = 1 if is_pooling else 2
        self.vllm_config = vllm_config
        # Every rank plans the same passes: the first one writes the trace.
        trace = get_envs().bucket_trace
        records = trace and vllm_config.parallel_config.rank == 0
        self.step_trace = TraceRecorder(Path(trace) if records else None)
        self.verify_queries = buckets.config.verify_queries
        self.image_spans: ImageSpans | None = None  # set with the KV caches

    def start_trace(self, num_kv_blocks: int) -> None:
        """Record step shapes from now on, if VLLM_HPU_BUCKET_TRACE asks to."""
        scheduler = self.vllm_config.scheduler_config
        self.step_trace.start(
            {
                "block_size": self.block_size,
                "max_num_seqs": scheduler.max_num_seqs,
                "max_num_batched_tokens": self.max_num_tokens,
                "max_model_len": self.vllm_config.model_config.max_model_len,
                "num_kv_blocks": num_kv_blocks,
            }
        )

    def plan(self, scheduler_output: SchedulerOutput, cache: CacheGeometry) -> StepPlan:
        """Prompt chunks in bucketed batches, then one decode batch."""
        seqs = scheduled_seqs(
            scheduler_output, self.input_batch, self.requests, self.image_spans
        )
        prompts, decodes = split_by_phase(
            seqs, self.min_prompt_tokens, self._drafted_rows()
        )
        if self.step_trace.recording:
            self.step_trace.record(self._step_shape(prompts, decodes))
        token_ids = self.input_batch.token_ids_cpu
        batches = split_prompt_passes(
            prompts, self.max_num_tokens, self.buckets, self.block_size
        )
        return StepPlan(
            prompts=[self._prompt_pass(b, token_ids, cache) for b in batches],
            decode=self._decode_pass(decodes, token_ids, cache) if decodes else None,
        )

    def _prompt_pass(
        self, batch: list[ScheduledSeq], token_ids: np.ndarray, cache: CacheGeometry
    ) -> ForwardPass:
        forward_pass = build_prompt_forward(batch, self.buckets, token_ids, cache)
        self.buckets.stats.record_prompt(
            forward_pass.bucket, [s.layout.num_scheduled_tokens for s in batch]
        )
        return forward_pass

    def _drafted_rows(self) -> frozenset[int]:
        """Rows whose drafts this step verifies."""
        if self.verify_queries == 1:
            return frozenset()
        rows = self.input_batch.spec_token_ids[: self.input_batch.num_reqs]
        return frozenset(row for row, drafts in enumerate(rows) if drafts)

    def _decode_pass(
        self, decodes: list[ScheduledSeq], token_ids: np.ndarray, cache: CacheGeometry
    ) -> ForwardPass:
        """One decode pass, a verification pass if some row has drafts."""
        num_blocks = flat_blocks(decodes, self.block_size)
        if max(s.layout.num_scheduled_tokens for s in decodes) > 1:
            forward_pass = build_decode_pass(
                decodes, self.buckets, token_ids, cache, self.verify_queries
            )
            query_lens = [s.layout.num_scheduled_tokens for s in decodes]
            self.buckets.stats.record_verify(
                forward_pass.bucket, query_lens, num_blocks
            )
            return forward_pass
        forward_pass = build_decode_pass(decodes, self.buckets, token_ids, cache)
        self.buckets.stats.record_decode(forward_pass.bucket, len(decodes), num_blocks)
        return forward_pass

    def _step_shape(
        self, prompts: list[ScheduledSeq], decodes: list[ScheduledSeq]
    ) -> StepShape:
        return StepShape(
            tuple(PromptChunk(s.layout.num_scheduled_tokens, s.start) for s in prompts),
            tuple(cdiv(s.end, self.block_size) for s in decodes),
        )
