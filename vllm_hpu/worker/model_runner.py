"""HpuModelRunner: one engine step in, padded bucketed forward passes, vLLM's sampler.

Lifecycle, in the order the worker drives it: ``load_model``, ``profile_run``,
``initialize_kv_cache``, then per step ``execute_model`` (forward passes, logits)
and ``sample_tokens`` (grammar mask, sampling, output). Under pipeline parallelism
only the last stage computes logits and samples; the stages before it return
their passes' intermediate tensors from ``execute_model`` for the worker to send.
"""

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from vllm.config import VllmConfig, get_layers_from_vllm_config, set_current_vllm_config
from vllm.logger import init_logger
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.model_executor.model_loader import get_model
from vllm.sequence import IntermediateTensors
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec
from vllm.v1.outputs import (
    EMPTY_MODEL_RUNNER_OUTPUT,
    DraftTokenIds,
    ModelRunnerOutput,
)
from vllm.v1.sample.sampler import Sampler

from vllm_hpu import device
from vllm_hpu.attention.metadata import CacheGeometry
from vllm_hpu.bucketing import Bucket, BucketingConfig, HpuBucketManager
from vllm_hpu.envs import get_envs
from vllm_hpu.quantization.moe_methods import check_moe_layers
from vllm_hpu.worker.capabilities import pipeline
from vllm_hpu.worker.capabilities.factory import attach_model, build_capabilities
from vllm_hpu.worker.capabilities.lora import LoRAAdapters
from vllm_hpu.worker.capabilities.weight_updates import weights_change
from vllm_hpu.worker.compilation.execution import (
    CompileOptions,
    ExecutionMode,
    GraphedModel,
    GraphKey,
    compile_options,
    graph_key,
    pack_linear_weights,
    select_mode,
)
from vllm_hpu.worker.compilation.layer_split import split_graph_every
from vllm_hpu.worker.kv_caches import (
    bind_kv_caches,
    bind_scratch_kv_caches,
    cache_geometry,
    group_cache_geometry,
    kv_cache_specs,
    layer_groups,
    reachable_decode_blocks,
    unbind_kv_caches,
)
from vllm_hpu.worker.passes.build import build_prompt_forward
from vllm_hpu.worker.passes.forward_pass import ForwardPass, sampled_token_indices
from vllm_hpu.worker.passes.planner import PassPlanner
from vllm_hpu.worker.passes.seqs import image_spans
from vllm_hpu.worker.passes.synthetic import largest_prompt_bucket, profile_seqs
from vllm_hpu.worker.state.async_output import HpuAsyncOutput, StepLogits
from vllm_hpu.worker.state.prompt_logprobs import PromptLogprobs
from vllm_hpu.worker.state.request_states import RequestStates, make_input_batch
from vllm_hpu.worker.step_sampler import PendingStep, StepSampler

logger = init_logger("vllm.hpu.model_runner")


class HpuModelRunner:
    def __init__(self, vllm_config: VllmConfig, torch_device: torch.device):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.device = torch_device
        self.stage = pipeline.Stage.of_this_rank()
        self.max_num_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.block_size = vllm_config.cache_config.block_size
        self.is_pooling_model = self.model_config.runner_type == "pooling"
        dtype = self.model_config.dtype
        assert isinstance(dtype, torch.dtype), "vLLM resolves the dtype first"
        self.dtype = dtype
        self.execution_mode = select_mode(
            device.is_lazy(),
            self.model_config.enforce_eager,
            device.model_compile_backend(),
        )
        # Across steps: vLLM's batch rows and the requests behind them.
        self.input_batch = make_input_batch(vllm_config, torch_device)
        self.states = RequestStates(self.input_batch, torch_device)
        self.prompt_logprobs = PromptLogprobs(self.states)
        self.sampler = Sampler(logprobs_mode=self.model_config.logprobs_mode)
        self.buckets = HpuBucketManager(
            BucketingConfig.from_vllm_config(vllm_config, get_envs())
        )
        # Async scheduling: in emulation the device stream runs step N while
        # the host prepares N+1.
        is_async = bool(vllm_config.scheduler_config.async_scheduling)
        self.stream = device.device_stream(queued=is_async)
        self.caps = build_capabilities(self, self.sampler, self.stream)
        self.step_sampler = StepSampler(self.states, self.caps)
        self.planner = PassPlanner(
            self.input_batch, self.states.requests, self.buckets, vllm_config
        )
        # vLLM's model classes add methods (compute_logits) beyond nn.Module.
        self.model: Any = None  # set by load_model
        # The buckets whose passes replay graphs (warmup's ``capture_graph``),
        # shared with a draft model's; what runs the model: set by load_model.
        self.graphed_buckets: set[GraphKey] = set()
        self.graphed_model: GraphedModel
        # Per layer: (key_cache, value_cache), or one latent cache for MLA.
        self.kv_caches: dict[str, Any] = {}  # set by initialize_kv_cache
        self.kv_cache_config: KVCacheConfig | None = None
        self.cache: CacheGeometry | None = None
        # Each attention layer's KV cache group; empty until the caches exist.
        self.layer_groups: dict[str, int] = {}
        self._pending: PendingStep | None = None
        self.packed_weights = False  # repacked for the CPU by load_model
        self.weights_memory = 0  # bytes the device meter saw load_model take

    # ---- lifecycle -------------------------------------------------------

    def load_model(self) -> None:
        started = time.perf_counter()
        device.release_freed_memory()
        used_before = device.memory_used()
        self.caps.eplb.before_load()
        with set_current_vllm_config(self.vllm_config):
            if self.model_config.is_hybrid:
                from vllm_hpu.attention.state_layers import register_state_layers

                register_state_layers()  # before vLLM builds the layers
            with self.caps.inc.loading(self.vllm_config.load_config):
                self.model = get_model(vllm_config=self.vllm_config)
            self.model = self.caps.lora.wrap(self.model, self.device)
        check_moe_layers(self.model)
        self.caps.eplb.after_load(self.model)
        self.model = self.caps.inc.apply(self.model, self.device)
        # INC replaces the linears: nothing to pack then.
        keep_layout = weights_change(self.vllm_config) or self.caps.inc.replaces_linears
        self.packed_weights = pack_linear_weights(
            self.model, self.execution_mode, keep_layout
        )
        split_graph_every(self.model, get_envs().config_hidden_layers)
        self.graphed_model = GraphedModel(
            self.model, self.vllm_config, self.graphed_buckets
        )
        self.caps.spec.load_model()  # a draft model loads after the target
        attach_model(self.caps, self, self.stage.is_first)
        # What loading holds on the device meter, its freed scratch returned
        # first (tests compare formats by it).
        device.release_freed_memory()
        self.weights_memory = device.memory_used() - used_before
        logger.info(
            "Loading model weights took %.2f s and %.4f GiB of device memory",
            time.perf_counter() - started,
            self.weights_memory / device.GiB,
        )

    def get_model(self) -> Any:
        assert self.model is not None, "load_model() first"
        return self.model

    def _cache_layers(self) -> dict[str, AttentionLayerBase]:
        """Every layer that caches: attention and a hybrid's state layers."""
        layer_type: Any = AttentionLayerBase  # abstract: mypy wants a concrete one
        return get_layers_from_vllm_config(self.vllm_config, layer_type)

    def _attention_layers(self) -> dict[str, AttentionLayerBase]:
        """The layers with a KV cache (not a hybrid's state layers)."""
        layers = self._cache_layers().items()
        return {n: layer for n, layer in layers if not isinstance(layer, MambaBase)}

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        return kv_cache_specs(self._cache_layers(), self.vllm_config, self.block_size)

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        """Allocate the flat KV caches (plus the dummy block) and bind them."""
        num_blocks = kv_cache_config.num_blocks
        self.kv_cache_config = kv_cache_config
        layers = self._attention_layers()
        self.kv_caches = bind_kv_caches(layers, kv_cache_config, self.device)
        self.caps.state_cache.allocate(kv_cache_config)
        self.cache = group_cache_geometry(
            layers, kv_cache_config, self.dtype, self.device
        )
        if self.model_config.is_mm_prefix_lm:  # Gemma 3's and 4's image tokens
            self.cache = self.cache.with_span_ends()
            spans = image_spans(self.model_config, list(layers.values()))
            self.planner.image_spans = spans
        block_size = self.cache.block_size
        assert block_size == self.block_size, (
            f"KV block size changed from {self.block_size} to {block_size} after "
            "the runner was built; the attention backend must prefer the platform's"
        )
        self.layer_groups = layer_groups(kv_cache_config, layers)
        self.buckets.set_num_kv_blocks(
            reachable_decode_blocks(
                kv_cache_config,
                self.vllm_config.scheduler_config.max_num_seqs,
                self.model_config.max_model_len,
            )
        )
        logger.info("# HPU blocks: %d, # CPU blocks: 0", num_blocks)
        self.caps.kv_connector.register_kv_caches(self.kv_caches, block_size)
        self.caps.routed_experts.start(kv_cache_config)

    def kv_cache_share(self, available: int) -> int:
        """Of ``available`` bytes, what the KV cache may take: less a hybrid
        model's state slots (and checkpoints), which the runner allocates."""
        return self.caps.state_cache.kv_cache_share(available)

    def release_kv_cache(self) -> None:
        """Free the KV caches and states (sleep mode); their blocks hold
        nothing afterwards."""
        self.stream.synchronize()
        self.kv_caches = unbind_kv_caches(self._attention_layers())
        self.caps.state_cache.free()

    def restore_kv_cache(self) -> None:
        """Allocate the caches ``release_kv_cache`` freed again, empty."""
        assert self.kv_cache_config is not None, "initialize_kv_cache() first"
        layers = self._attention_layers()
        self.kv_caches = bind_kv_caches(layers, self.kv_cache_config, self.device)
        self.caps.state_cache.allocate(self.kv_cache_config)
        self.graphed_model.reset()

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
        bucket = largest_prompt_bucket(self.buckets)
        max_len = self.model_config.max_model_len
        merged = self.buckets.config.merged_prefill
        seqs = profile_seqs(bucket, merged, self.block_size, max_len)
        bind_scratch_kv_caches(
            self._attention_layers(), self.get_kv_cache_spec(), self.device
        )
        self.caps.state_cache.allocate()  # every row on the dummy slot
        token_ids = torch.zeros((1, bucket.query_len), dtype=torch.int64).numpy()
        forward_pass = build_prompt_forward(
            seqs, self.buckets, token_ids, self._geometry(1)
        )
        self._forward(forward_pass, *self._stage_inputs([forward_pass], None))
        device.synchronize()
        unbind_kv_caches(self._attention_layers())
        self.caps.state_cache.free()

    # ---- one engine step -------------------------------------------------

    @torch.no_grad()
    def execute_model(
        self,
        scheduler_output: SchedulerOutput,
        intermediate_tensors: IntermediateTensors | None = None,
    ) -> ModelRunnerOutput | IntermediateTensors | None:
        """Run the step's passes. ``intermediate_tensors``: what the previous
        pipeline stage sent for this step; warmup runs without it."""
        with self.caps.profiler.span("prepare"):
            self.caps.before_update(scheduler_output)
            self.states.update(scheduler_output)
            self.caps.after_update(scheduler_output, self.states.requests)
            if not scheduler_output.total_num_scheduled_tokens:
                # Empty, but for a KV connector's transfers, which go on.
                return self.caps.kv_connector.no_forward_output(scheduler_output)
            passes = self._plan_passes(scheduler_output)
        inputs = self._stage_inputs(passes, intermediate_tensors)
        if not self.stage.is_last:
            return pipeline.join(
                [self._forward(p, x) for p, x in zip(passes, inputs, strict=True)]
            )
        pairs = list(zip(passes, inputs, strict=True))
        if self.is_pooling_model:  # pooling models answer here: no sampling
            outputs = ((p, self._forward(p, x)) for p, x in pairs)
            return self.caps.pooler.pool(scheduler_output, outputs)
        num_sampled = 1 + self.caps.spec.num_draft_tokens()
        with self.caps.kv_connector.step(scheduler_output):
            passes_done = self.stream.submit(
                self._run_passes, pairs, num_sampled, scheduler_output
            )
        self._pending = PendingStep(
            scheduler_output=scheduler_output,
            device=passes_done,
            discard_rows=self.states.rows_inside_prompt(scheduler_output),
            spec_metadata=self.caps.spec.metadata(self.device),
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

    def _stage_inputs(
        self, passes: list[ForwardPass], received: IntermediateTensors | None
    ) -> Sequence[IntermediateTensors | None]:
        sizes = [p.num_tokens for p in passes]
        return pipeline.stage_inputs(
            self.stage, sizes, received, self._empty_intermediate_tensors
        )

    def _empty_intermediate_tensors(self, num_tokens: int) -> IntermediateTensors:
        return self.get_model().make_empty_intermediate_tensors(
            batch_size=num_tokens, dtype=self.dtype, device=self.device
        )

    def _plan_passes(self, scheduler_output: SchedulerOutput) -> list[ForwardPass]:
        """The step's padded passes (worker/passes/): prompts, then decodes."""
        assert self.cache is not None, "initialize_kv_cache() first"
        plan = self.planner.plan(scheduler_output, self.cache)
        self.caps.state_cache.add_metadata(plan.passes)
        if plan.decode is not None:
            self.caps.async_feed.feed(plan.decode)
        return self.caps.data_parallel.align(plan.passes, self.cache)

    @torch.no_grad()
    def execute_dummy_batch(self) -> None:
        """A step without work while other data-parallel ranks have some: their
        MoE layers wait for this rank's idle passes."""
        if self.cache is None:
            return
        passes = self.caps.data_parallel.align([], self.cache)
        self.stream.submit(lambda: [self._forward(p, None) for p in passes]).result()

    def _forward(
        self,
        forward_pass: ForwardPass,
        intermediate_tensors: IntermediateTensors | None,
    ) -> Any:
        """Run the model on one padded pass; returns hidden states [num_tokens, H]
        on the last pipeline stage, IntermediateTensors on the others."""
        groups = self.layer_groups or dict.fromkeys(self._attention_layers(), 0)
        metadata: dict[str, Any] = dict(forward_pass.metadata_by_layer(groups))
        state_cache = self.caps.state_cache
        metadata |= state_cache.metadata_by_layer(forward_pass)
        state_cache.before_pass(forward_pass)
        self.caps.lora.set_pass(forward_pass)
        self.caps.eplb.before_pass(forward_pass.num_real_tokens)
        self.caps.routed_experts.before_pass(forward_pass)
        phase, bucket = graph_key(forward_pass)
        with self.caps.profiler.span("forward", phase=phase, bucket=bucket):
            inputs = self.caps.model_inputs(forward_pass)
            inputs["intermediate_tensors"] = intermediate_tensors
            hidden = self.graphed_model.run(forward_pass, inputs, metadata)
        state_cache.after_pass(forward_pass)
        self.caps.routed_experts.after_pass(forward_pass)
        # A draft model writes the pass into its KV cache.
        return self.caps.spec.after_target_pass(forward_pass, hidden)

    def _compute_logits(self, hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """Logits of ``hidden``, whose states belong to InputBatch ``rows``."""
        self.caps.lora.set_logits_rows(rows)
        return self.get_model().compute_logits(hidden)

    @torch.no_grad()
    def sample_tokens(
        self, grammar_output: GrammarOutput | None
    ) -> ModelRunnerOutput | HpuAsyncOutput:
        pending, self._pending = self._pending, None
        if pending is None:
            return EMPTY_MODEL_RUNNER_OUTPUT
        # The forward passes are queued: now the host may wait for step N-1.
        self.caps.async_feed.record_on_host()
        sampled = self.stream.submit(
            self.step_sampler.sample,
            pending,
            grammar_output,
            self.input_batch.sampling_metadata,
        )
        return self.caps.async_feed.finish(
            sampled,
            pending.discard_rows,
            lambda: self.step_sampler.output(pending, sampled.result()),
            self.caps.routed_experts.step_output(pending.device, pending.discard_rows),
        )

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafts proposed in the last step, for the scheduler's next."""
        return self.caps.spec.take_draft_token_ids()

    # ---- for the worker and warmup ---------------------------------------

    def apply_execution_mode(self) -> CompileOptions | None:
        """Compile the model (and a draft model) or wrap it for graphs, once,
        before warmup; returns how it compiles, if it does."""
        num_buckets = len(self.buckets.prompt_buckets) + len(
            self.buckets.decode_buckets
        )
        num_models = 1 + self.caps.spec.has_draft_model
        options = compile_options(num_buckets, num_models)
        mode = self.execution_mode
        self.graphed_model.prepare(mode, options)
        self.caps.spec.prepare(mode, options)
        how = ""
        if mode is ExecutionMode.COMPILE and options is not None:
            how = f" (backend={options.backend}, whole model)"
        logger.info("Execution mode: %s%s", mode.value, how)
        return options

    def capture_graph(self, phase: str, bucket: Bucket) -> None:
        """From now on, passes of ``bucket`` replay a graph, recorded on the
        next one (warmup's capture, within the graph memory budget)."""
        self.graphed_buckets.add((phase, bucket))

    def start_serving(self) -> None:
        """After warmup: record step shapes from now on, if asked to; EPLB
        counts no load from warmup's passes."""
        if self.cache is not None:
            self.planner.start_trace(self.cache.num_blocks)
        self.caps.eplb.after_warmup()

    def end_engine_step(self, is_dummy: bool = False) -> None:
        """An engine step is done (vLLM's EPLB counts them; warmup's are not)."""
        self.caps.eplb.step(is_dummy)

    def synchronize(self) -> None:
        """Wait for the queued device work (it reads weights, adapters and
        caches the worker is about to change)."""
        self.stream.synchronize()

    def lora_adapters(self) -> LoRAAdapters:
        """The LoRA adapters, for the worker to change: no queued pass reads
        them any more."""
        self.synchronize()
        return self.caps.lora

    def reset_encoder_cache(self) -> None:
        self.caps.multimodal.reset()

    def shutdown_inc(self) -> None:
        """Write Intel Neural Compressor's measurements (MEASURE only)."""
        self.synchronize()  # queued passes are measured
        self.caps.inc.finalize()

    def shutdown(self) -> None:
        self.shutdown_inc()
        logger.info(self.buckets.stats.summary())
        self.caps.profiler.write()
