"""HpuModelRunner: one engine step in, padded bucketed forward passes, vLLM's sampler.

Lifecycle, in the order the worker drives it: ``load_model``, ``profile_run``,
``initialize_kv_cache``, then per step ``execute_model`` (forward passes, logits)
and ``sample_tokens`` (grammar mask, sampling, output). Under pipeline parallelism
only the last stage computes logits and samples; the stages before it return
their passes' intermediate tensors from ``execute_model`` for the worker to send.
"""

import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from vllm.config import VllmConfig, get_layers_from_vllm_config, set_current_vllm_config
from vllm.forward_context import set_forward_context
from vllm.logger import init_logger
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.model_executor.model_loader import get_model
from vllm.model_executor.models.interfaces import supports_multimodal
from vllm.sequence import IntermediateTensors
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec
from vllm.v1.outputs import (
    EMPTY_MODEL_RUNNER_OUTPUT,
    DraftTokenIds,
    ModelRunnerOutput,
)
from vllm.v1.sample.logits_processor import build_logitsprocs
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.sampler import Sampler
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
from vllm.v1.structured_output.utils import apply_grammar_bitmask
from vllm.v1.worker.gpu_input_batch import InputBatch

from vllm_hpu import device
from vllm_hpu.attention.metadata import CacheGeometry, SeqLayout
from vllm_hpu.bucketing import Bucket, BucketingConfig, HpuBucketManager
from vllm_hpu.bucketing.trace import PromptChunk, StepShape, TraceRecorder
from vllm_hpu.envs import get_envs
from vllm_hpu.ops.fused_moe import check_moe_layers
from vllm_hpu.profiler import StepProfiler
from vllm_hpu.quantization.inc_flow import IncFlow
from vllm_hpu.worker.capabilities import pipeline
from vllm_hpu.worker.capabilities.lora import HpuLoRA
from vllm_hpu.worker.capabilities.mrope import MRopePositions, mrope_positions_for
from vllm_hpu.worker.capabilities.multimodal import MultimodalInputs
from vllm_hpu.worker.capabilities.pooling import StepPooler
from vllm_hpu.worker.kv_caches import (
    bind_kv_caches,
    bind_scratch_kv_caches,
    cache_geometry,
    kv_cache_specs,
)
from vllm_hpu.worker.passes.build import ForwardPass, ScheduledSeq, build_decode_pass
from vllm_hpu.worker.passes.split import (
    build_prompt_forward,
    profile_seqs,
    split_prompt_passes,
)
from vllm_hpu.worker.spec_decode.decoder import SpecDecoder, sampled_token_indices
from vllm_hpu.worker.state.async_output import (
    AsyncTokenFeed,
    HpuAsyncOutput,
    SampledStep,
    StepLogits,
    keeping_generators,
)
from vllm_hpu.worker.state.prompt_logprobs import PromptLogprobs
from vllm_hpu.worker.state.request_states import RequestStates
from vllm_hpu.worker.warmup.execution import ExecutionMode, select_mode
from vllm_hpu.worker.warmup.layer_split import split_graph_every

logger = init_logger("vllm.hpu.model_runner")


@dataclass
class _PendingStep:
    """What execute_model hands to sample_tokens."""

    scheduler_output: SchedulerOutput
    # The passes on the device stream; logits [num_sampled, vocab_size]: per
    # row in InputBatch order, its draft positions (speculative decoding)
    # then its last token.
    device: "Future[StepLogits]"
    discard_rows: list[int]  # rows inside a prompt: their sample is dropped
    spec_metadata: SpecDecodeMetadata | None  # None: one token per row


class HpuModelRunner:
    def __init__(self, vllm_config: VllmConfig, torch_device: torch.device):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.device = torch_device
        self.stage = pipeline.Stage.of_this_rank()
        scheduler_config = vllm_config.scheduler_config
        self.max_num_tokens = scheduler_config.max_num_batched_tokens
        self.block_size = vllm_config.cache_config.block_size
        self.is_pooling_model = self.model_config.runner_type == "pooling"
        self.input_batch = self._make_input_batch()
        self.states = RequestStates(self.input_batch, torch_device)
        self.prompt_logprobs = PromptLogprobs(self.states)
        self.sampler = Sampler(logprobs_mode=self.model_config.logprobs_mode)
        self.spec: SpecDecoder | None = None
        if vllm_config.speculative_config is not None:
            self.spec = SpecDecoder(self)
        self.buckets = HpuBucketManager(
            BucketingConfig.from_vllm_config(vllm_config, get_envs())
        )
        # vLLM's model classes add methods (compute_logits) beyond nn.Module.
        self.model: Any = None
        self.pooler: StepPooler | None = None  # set by load_model for pooling
        # Set by load_model for a multimodal model, on the first pipeline stage.
        self.multimodal: MultimodalInputs | None = None
        self.mrope: MRopePositions | None = None  # set by load_model for M-RoPE
        self.lora = (
            HpuLoRA(vllm_config, self.input_batch) if vllm_config.lora_config else None
        )
        self.inc = IncFlow.from_config(vllm_config)  # QUANT_CONFIG: measure or fp8
        dtype = self.model_config.dtype
        assert isinstance(dtype, torch.dtype), "vLLM resolves the dtype first"
        self.dtype = dtype
        self.execution_mode = select_mode(
            device.is_lazy(),
            self.model_config.enforce_eager,
            device.model_compile_backend(),
        )
        # Per layer: (key_cache, value_cache), or one latent cache for MLA.
        self.kv_caches: dict[str, Any] = {}
        self.cache: CacheGeometry | None = None
        self._pending: _PendingStep | None = None
        # Async scheduling: step N's tokens reach step N+1 on the device, and
        # in emulation the device stream runs step N while the host prepares N+1.
        is_async = bool(vllm_config.scheduler_config.async_scheduling)
        self.stream = device.device_stream(queued=is_async)
        self.async_feed = (
            AsyncTokenFeed(self.input_batch, self.states, self.stream)
            if is_async
            else None
        )
        # Set by warmup (worker/warmup.py): what runs the buckets given graphs.
        self.graph_model: Any = None
        self.graphed_buckets: set[tuple[str, Bucket]] = set()
        envs = get_envs()
        self.profiler = StepProfiler(
            envs.profiler_enabled, envs.profile_dir, vllm_config.parallel_config.rank
        )
        # VLLM_HPU_BUCKET_TRACE: real step shapes for the bucket planner. Every
        # rank plans the same passes: the first one writes them.
        records = envs.bucket_trace and vllm_config.parallel_config.rank == 0
        self.step_trace = TraceRecorder(Path(envs.bucket_trace)) if records else None

    def _make_input_batch(self) -> InputBatch:
        max_model_len = self.model_config.max_model_len
        max_num_reqs = self.vllm_config.scheduler_config.max_num_seqs
        return InputBatch(
            max_num_reqs=max_num_reqs,
            max_model_len=max_model_len,
            max_num_batched_tokens=self.max_num_tokens,
            device=self.device,
            vocab_size=self.model_config.get_vocab_size(),
            block_sizes=[self.block_size],
            max_num_blocks_per_req=[-(-max_model_len // self.block_size)],
            logitsprocs=build_logitsprocs(
                self.vllm_config, self.device, False, self.is_pooling_model, ()
            ),
            is_pooling_model=self.is_pooling_model,
        )

    # ---- lifecycle -------------------------------------------------------

    def load_model(self) -> None:
        started = time.perf_counter()
        used_before = device.memory_used()
        with set_current_vllm_config(self.vllm_config):
            self.model = get_model(vllm_config=self.vllm_config)
            if self.lora is not None:
                self.model = self.lora.wrap(self.model, self.device)
        check_moe_layers(self.model)
        if self.inc is not None:  # INC replaces the linears: nothing to pack
            self.model = self.inc.apply(self.model)
        elif self.execution_mode is ExecutionMode.EAGER:
            # Compilers lower the layers as vLLM defines them: inductor cannot
            # take oneDNN's packed weights as graph inputs.
            device.prepare_weights(self.model)
        split_graph_every(self.model, get_envs().config_hidden_layers)
        if self.spec is not None:  # a draft model loads after the target
            self.spec.proposer.load_model()
        self.mrope = mrope_positions_for(
            self.model, self.model_config, self.input_batch, self.states.requests
        )
        if self.is_pooling_model:
            self.pooler = StepPooler(self.input_batch, self.model, self.model_config)
        if supports_multimodal(self.model) and self.stage.is_first:
            self.multimodal = MultimodalInputs(
                self.vllm_config,
                self.model,
                self.input_batch,
                self.states.requests,
                self.device,
            )
        logger.info(
            "Loading model weights took %.2f s and %.4f GiB of device memory",
            time.perf_counter() - started,
            (device.memory_used() - used_before) / device.GiB,
        )

    def get_model(self) -> Any:
        assert self.model is not None, "load_model() first"
        return self.model

    def _attention_layers(self) -> dict[str, AttentionLayerBase]:
        return get_layers_from_vllm_config(
            self.vllm_config,
            AttentionLayerBase,  # type: ignore[type-abstract]
        )

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        return kv_cache_specs(
            self._attention_layers(), self.vllm_config, self.block_size
        )

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        """Allocate the flat KV caches (plus the dummy block) and bind them."""
        num_blocks = kv_cache_config.num_blocks
        self.kv_caches = bind_kv_caches(
            self._attention_layers(), kv_cache_config, self.device
        )
        block_size = kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
        assert block_size == self.block_size, (
            f"KV block size changed from {self.block_size} to {block_size} after "
            "the runner was built; the attention backend must prefer the platform's"
        )
        self.cache = self._geometry(num_blocks)
        self.buckets.set_num_kv_blocks(num_blocks)
        logger.info("# HPU blocks: %d, # CPU blocks: 0", num_blocks)

    def _geometry(self, num_blocks: int) -> CacheGeometry:
        return cache_geometry(
            self._attention_layers(),
            self.block_size,
            num_blocks,
            self.dtype,
            self.device,
        )

    @torch.no_grad()
    def profile_run(self) -> None:
        """Run the largest prompt bucket once, so its peak memory is measured.

        The KV caches do not exist yet: a throw-away cache of one block takes
        the writes (every slot lands in block 0 or the dummy block).
        """
        bucket = max(
            (b for b in self.buckets.prompt_buckets if b.num_blocks == 0),
            key=lambda b: (b.batch_size * b.query_len, b.query_len),
        )
        seqs = profile_seqs(
            bucket,
            self.buckets.config.merged_prefill,
            self.block_size,
            self.model_config.max_model_len,
        )
        bind_scratch_kv_caches(
            self._attention_layers(), self.get_kv_cache_spec(), self.device
        )
        token_ids = torch.zeros((1, bucket.query_len), dtype=torch.int64).numpy()
        forward_pass = build_prompt_forward(
            seqs, self.buckets, token_ids, self._geometry(1)
        )
        self._forward(forward_pass, *self._stage_inputs([forward_pass], None))
        device.synchronize()
        for layer in self._attention_layers().values():
            # 2-D: an MLA layer squeezes dim 1 of what it is given.
            layer.bind_kv_cache(torch.empty(0, 1))

    def start_step_trace(self) -> None:
        """Record step shapes from now on (after warmup), if asked to."""
        if self.step_trace is not None and self.cache is not None:
            scheduler = self.vllm_config.scheduler_config
            self.step_trace.start(
                {
                    "block_size": self.block_size,
                    "max_num_seqs": scheduler.max_num_seqs,
                    "max_num_batched_tokens": self.max_num_tokens,
                    "max_model_len": self.model_config.max_model_len,
                    "num_kv_blocks": self.cache.num_blocks,
                }
            )

    # ---- one engine step -------------------------------------------------

    @torch.no_grad()
    def execute_model(
        self,
        scheduler_output: SchedulerOutput,
        intermediate_tensors: IntermediateTensors | None = None,
    ) -> ModelRunnerOutput | IntermediateTensors | None:
        """Run the step's passes. ``intermediate_tensors``: what the previous
        pipeline stage sent for this step; warmup runs without it."""
        with self.profiler.span("prepare"):
            if self.pooler is not None:
                self.pooler.prepare_new_requests(scheduler_output)
            if self.async_feed is not None:
                self.async_feed.before_update(scheduler_output)
            self.states.update(scheduler_output)
            if self.multimodal is not None:
                self.multimodal.update(scheduler_output)
            if self.spec is not None:
                self.spec.update(scheduler_output, self.states.requests)
            if not scheduler_output.total_num_scheduled_tokens:
                return EMPTY_MODEL_RUNNER_OUTPUT
            passes = self._plan_passes(scheduler_output)
        inputs = self._stage_inputs(passes, intermediate_tensors)
        if not self.stage.is_last:
            return pipeline.join(
                [self._forward(p, x) for p, x in zip(passes, inputs, strict=True)]
            )
        pairs = list(zip(passes, inputs, strict=True))
        if self.pooler is not None:  # pooling models answer here: nothing to sample
            outputs = ((p, self._forward(p, x)) for p, x in pairs)
            return self.pooler.pool(scheduler_output, outputs)
        num_sampled = 1 + self._num_draft_tokens()
        self._pending = _PendingStep(
            scheduler_output=scheduler_output,
            device=self.stream.submit(
                self._run_passes, pairs, num_sampled, scheduler_output
            ),
            discard_rows=self._rows_inside_prompt(scheduler_output),
            spec_metadata=self.spec.metadata(self.device) if self.spec else None,
        )
        return None

    def _run_passes(
        self,
        pairs: list[tuple[ForwardPass, IntermediateTensors | None]],
        num_sampled: np.ndarray,
        scheduler_output: SchedulerOutput,
    ) -> StepLogits:
        """Device work: the step's passes, then the logits of the positions to
        sample (``num_sampled`` per row)."""
        cu_num_sampled = np.cumsum(num_sampled)
        hidden_size = self.model_config.get_hidden_size()
        sample_hidden = torch.empty(
            (int(cu_num_sampled[-1]), hidden_size), dtype=self.dtype, device=self.device
        )
        for forward_pass, stage_input in pairs:
            hidden = self._forward(forward_pass, stage_input)
            dst, src = sampled_token_indices(forward_pass, num_sampled, cu_num_sampled)
            sample_hidden[dst] = hidden[src]
            self.prompt_logprobs.collect(forward_pass, hidden, self._compute_logits)
        # Each sampled position's InputBatch row (several per row with drafts).
        sample_rows = np.repeat(np.arange(len(num_sampled)), num_sampled).tolist()
        return StepLogits(
            logits=self._compute_logits(sample_hidden, sample_rows),
            prompt_logprobs=self.prompt_logprobs.finish(scheduler_output),
        )

    def _num_draft_tokens(self) -> np.ndarray:
        if self.spec is None:
            return np.zeros(self.input_batch.num_reqs, dtype=np.int64)
        return self.spec.num_draft_tokens()

    def _stage_inputs(
        self, passes: list[ForwardPass], received: IntermediateTensors | None
    ) -> Sequence[IntermediateTensors | None]:
        """Per pass, what this stage starts from: nothing on the first stage,
        the previous stage's tensors (or zeros, when warming up) on the others."""
        sizes = [p.num_tokens for p in passes]
        if self.stage.is_first:
            return [None] * len(passes)
        if received is None:
            return [self._empty_intermediate_tensors(size) for size in sizes]
        return pipeline.split(received, sizes)

    def _empty_intermediate_tensors(self, num_tokens: int) -> IntermediateTensors:
        return self.get_model().make_empty_intermediate_tensors(
            batch_size=num_tokens, dtype=self.dtype, device=self.device
        )

    def _scheduled_seqs(self, scheduler_output: SchedulerOutput) -> list[ScheduledSeq]:
        seqs = []
        for row, req_id in enumerate(self.input_batch.req_ids):
            state = self.states.requests[req_id]
            seqs.append(
                ScheduledSeq(
                    row=row,
                    layout=SeqLayout(
                        block_table=state.block_ids[0],
                        num_computed_tokens=state.num_computed_tokens,
                        num_scheduled_tokens=scheduler_output.num_scheduled_tokens[
                            req_id
                        ],
                    ),
                )
            )
        return seqs

    def _plan_passes(self, scheduler_output: SchedulerOutput) -> list[ForwardPass]:
        """Prompt chunks in bucketed batches, then one decode batch."""
        assert self.cache is not None, "initialize_kv_cache() first"
        seqs = self._scheduled_seqs(scheduler_output)
        # Pooling models never decode: a one-token prompt (or last chunk) runs
        # as a prompt pass, so only prompt buckets are ever used.
        min_prompt_tokens = 1 if self.is_pooling_model else 2
        decodes = [s for s in seqs if s.layout.num_scheduled_tokens < min_prompt_tokens]
        prompts = [
            s for s in seqs if s.layout.num_scheduled_tokens >= min_prompt_tokens
        ]
        if self.step_trace is not None:
            self.step_trace.record(self._step_shape(prompts, decodes))
        token_ids = self.input_batch.token_ids_cpu
        passes = []
        batches = split_prompt_passes(
            prompts, self.max_num_tokens, self.buckets, self.block_size
        )
        for batch in batches:
            forward_pass = build_prompt_forward(
                batch, self.buckets, token_ids, self.cache
            )
            self.buckets.stats.record_prompt(
                forward_pass.bucket, [s.layout.num_scheduled_tokens for s in batch]
            )
            passes.append(forward_pass)
        if decodes:
            forward_pass = build_decode_pass(
                decodes, self.buckets, token_ids, self.cache
            )
            num_blocks = sum(-(-s.end // self.block_size) for s in decodes)
            self.buckets.stats.record_decode(
                forward_pass.bucket, len(decodes), num_blocks
            )
            if self.async_feed is not None:
                self.async_feed.feed(forward_pass)
            passes.append(forward_pass)
        return passes

    def _step_shape(
        self, prompts: list[ScheduledSeq], decodes: list[ScheduledSeq]
    ) -> StepShape:
        return StepShape(
            tuple(PromptChunk(s.layout.num_scheduled_tokens, s.start) for s in prompts),
            tuple(-(-s.end // self.block_size) for s in decodes),
        )

    def _forward(
        self,
        forward_pass: ForwardPass,
        intermediate_tensors: IntermediateTensors | None,
    ) -> Any:
        """Run the model on one padded pass; returns hidden states [num_tokens, H]
        on the last pipeline stage, IntermediateTensors on the others."""
        layer_names = self._attention_layers()
        attn_metadata = dict.fromkeys(layer_names, forward_pass.attn_metadata)
        # MLA layers write their cache before attending, from this mapping.
        slot_mapping = dict.fromkeys(
            layer_names, forward_pass.attn_metadata.slot_mapping
        )
        phase = "prompt" if forward_pass.is_prompt else "decode"
        graphed = (phase, forward_pass.bucket) in self.graphed_buckets
        model = self.graph_model if graphed else self.get_model()
        if self.lora is not None:
            self.lora.set_pass(forward_pass)
        with (
            self.profiler.span("forward", phase=phase, bucket=forward_pass.bucket),
            set_forward_context(
                attn_metadata,
                self.vllm_config,
                num_tokens=forward_pass.num_tokens,
                slot_mapping=slot_mapping,
            ),
        ):
            hidden = model(
                positions=self._positions(forward_pass),
                intermediate_tensors=intermediate_tensors,
                **self._token_inputs(forward_pass),
            )
            device.mark_step()
        if self.spec is not None:  # a draft model writes the pass into its KV
            hidden = self.spec.proposer.after_target_pass(forward_pass, hidden)
        return hidden

    def _positions(self, forward_pass: ForwardPass) -> torch.Tensor:
        """[num_tokens], or [3, num_tokens] for an M-RoPE model."""
        if self.mrope is None:
            return forward_pass.positions
        return self.mrope.positions(forward_pass)

    def _token_inputs(self, forward_pass: ForwardPass) -> dict[str, Any]:
        """Token ids, or for a multimodal model input embeddings on every pass
        (encoder outputs merged in), so each bucket compiles one graph."""
        if self.multimodal is None:
            return {"input_ids": forward_pass.input_ids}
        with self.profiler.span("embed", bucket=forward_pass.bucket):
            embeds = self.multimodal.embed(forward_pass)
        return {"input_ids": None, "inputs_embeds": embeds}

    def _compute_logits(self, hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """Logits of ``hidden``, whose states belong to InputBatch ``rows``."""
        if self.lora is not None:
            self.lora.set_logits_rows(rows)
        return self.get_model().compute_logits(hidden)

    def _rows_inside_prompt(self, scheduler_output: SchedulerOutput) -> list[int]:
        """Rows whose scheduled tokens stop short of the end of their prompt."""
        rows = []
        for row, req_id in enumerate(self.input_batch.req_ids):
            state = self.states.requests[req_id]
            scheduled = scheduler_output.num_scheduled_tokens[req_id]
            if state.num_computed_tokens + scheduled < state.num_tokens:
                rows.append(row)
        return rows

    @torch.no_grad()
    def sample_tokens(
        self, grammar_output: GrammarOutput | None
    ) -> ModelRunnerOutput | HpuAsyncOutput:
        pending, self._pending = self._pending, None
        if pending is None:
            return EMPTY_MODEL_RUNNER_OUTPUT
        if self.async_feed is not None:
            # The forward passes are queued: now the host may wait for step N-1.
            self.async_feed.record_on_host()
        sampled = self.stream.submit(
            self._sample, pending, grammar_output, self.input_batch.sampling_metadata
        )
        if self.async_feed is not None:
            # The sampled tokens stay on the device for the next step; the
            # host copy completes in the output (never with drafts).
            output = ModelRunnerOutput(
                req_ids=list(self.input_batch.req_ids),
                req_id_to_index=dict(self.input_batch.req_id_to_index),
            )
            return self.async_feed.launch(output, sampled, pending.discard_rows)
        return self._make_output(pending, sampled.result())

    def _sample(
        self,
        pending: _PendingStep,
        grammar_output: GrammarOutput | None,
        sampling_metadata: SamplingMetadata,
    ) -> SampledStep:
        """Device work, after the step's passes: the grammar mask, then each
        row's token, or its accepted drafts plus one."""
        step = pending.device.result()  # done: it was queued before
        if grammar_output is not None:
            apply_grammar_bitmask(
                pending.scheduler_output,
                grammar_output,
                self.input_batch,
                step.logits,
            )
        generators = self.input_batch.generators
        with (
            self.profiler.span("sample"),
            keeping_generators(generators, pending.discard_rows),
        ):
            if pending.spec_metadata is not None:
                assert self.spec is not None
                sampled, logprobs = self.spec.sample(
                    pending.spec_metadata,
                    step.logits,
                    sampling_metadata,
                    pending.discard_rows,
                )
                return SampledStep(sampled, logprobs, step.prompt_logprobs)
            output = self.sampler(
                logits=step.logits, sampling_metadata=sampling_metadata
            )
        return SampledStep(
            output.sampled_token_ids, output.logprobs_tensors, step.prompt_logprobs
        )

    def _make_output(
        self, pending: _PendingStep, step: SampledStep
    ) -> ModelRunnerOutput:
        sampled_token_ids, logprobs = step.on_host(pending.discard_rows)
        for row, tokens in enumerate(sampled_token_ids):
            for token_id in tokens:
                self.states.append_sampled(row, token_id)
        if self.spec is not None:
            self.spec.propose(pending.scheduler_output, sampled_token_ids)
        return ModelRunnerOutput(
            req_ids=list(self.input_batch.req_ids),
            req_id_to_index=dict(self.input_batch.req_id_to_index),
            sampled_token_ids=sampled_token_ids,
            logprobs=logprobs,
            prompt_logprobs_dict=step.prompt_logprobs,
        )

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafts proposed in the last step, for the scheduler's next."""
        return self.spec.take_draft_token_ids() if self.spec is not None else None
