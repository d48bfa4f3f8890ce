"""Every optional part of the runner, constructed here and nowhere else.

``build_capabilities`` makes what the configuration alone decides (with the
runner); ``attach_model`` what depends on the loaded model. Each part is None
where it is not asked for, and the runner calls it at its hook points:

- ``load_model``: ``lora.wrap``, ``inc.apply``, ``spec.proposer.load_model``;
- ``initialize_kv_cache``: ``kv_connector.register_kv_caches``;
- each step, before planning: ``before_update`` and ``after_update`` hand the
  scheduler output around (request states are updated between the two); after
  planning ``async_feed.feed`` and ``data_parallel.align`` (in
  ``execute_dummy_batch`` too); the passes inside ``kv_connector_step``, and
  ``no_forward_output`` for a step without tokens;
- each pass: ``lora.set_pass``, ``model_inputs`` (M-RoPE positions, multimodal
  embeddings), then ``spec.proposer.after_target_pass``;
- sampling: ``spec.sample``, ``async_feed.launch``, ``spec.propose``,
  ``kv_connector_output``;
- the worker's RPCs: ``sleep`` (sleep, wake_up, discard) and ``weight_updates``
  (init_weight_transfer_engine, start/finish_weight_update, update_weights).

A new capability (a KV connector, sleep mode, a state-space cache, ...) is a
field here, built in one of the two functions, and called from the hook its
work belongs to (docs/architecture.md, "The worker, room by room").
"""

import contextlib
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm.config import get_layers_from_vllm_config
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.model_executor.models.interfaces import supports_multimodal
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import MambaSpec
from vllm.v1.outputs import (
    EMPTY_MODEL_RUNNER_OUTPUT,
    KVConnectorOutput,
    ModelRunnerOutput,
)
from vllm.v1.sample.sampler import Sampler
from vllm.v1.worker.gpu_input_batch import CachedRequestState

from vllm_hpu.bucketing.trace import TraceRecorder
from vllm_hpu.emulation.device_stream import DeviceStream
from vllm_hpu.envs import get_envs
from vllm_hpu.kv_transfer.connectors import has_kv_connector
from vllm_hpu.quantization.inc_flow import IncFlow
from vllm_hpu.worker.capabilities.data_parallel import (
    DataParallelPasses,
    exchanges_tokens,
)
from vllm_hpu.worker.capabilities.kv_connector import KVConnectorSteps
from vllm_hpu.worker.capabilities.lora import HpuLoRA
from vllm_hpu.worker.capabilities.mrope import MRopePositions, mrope_positions_for
from vllm_hpu.worker.capabilities.multimodal import MultimodalInputs
from vllm_hpu.worker.capabilities.pooling import StepPooler
from vllm_hpu.worker.capabilities.sleep import HpuSleepMode
from vllm_hpu.worker.capabilities.state_cache import HpuStateCache
from vllm_hpu.worker.capabilities.weight_updates import WeightUpdates
from vllm_hpu.worker.diagnostics.profiler import StepProfiler
from vllm_hpu.worker.passes.forward_pass import ForwardPass
from vllm_hpu.worker.spec_decode.decoder import SpecDecoder
from vllm_hpu.worker.spec_decode.interface import TargetRunner
from vllm_hpu.worker.state.async_output import AsyncTokenFeed


@dataclass
class Capabilities:
    lora: HpuLoRA | None  # --enable-lora
    spec: SpecDecoder | None  # --speculative-config
    inc: IncFlow | None  # --quantization inc / QUANT_CONFIG: measure or fp8
    # Async scheduling: step N's tokens reach step N+1 on the device.
    async_feed: AsyncTokenFeed | None
    profiler: StepProfiler  # VLLM_PROFILER_ENABLED (a no-op otherwise)
    step_trace: TraceRecorder | None  # VLLM_HPU_BUCKET_TRACE
    kv_connector: KVConnectorSteps | None  # --kv-transfer-config, --kv-offloading-size
    sleep: HpuSleepMode | None  # enable_sleep_mode
    # --data-parallel-size with a MoE model: as many passes as the other ranks.
    data_parallel: DataParallelPasses | None
    # Set by ``attach_model``:
    pooler: StepPooler | None = None  # a pooling model
    multimodal: MultimodalInputs | None = None  # on the first pipeline stage
    mrope: MRopePositions | None = None  # a model with M-RoPE positions
    weight_updates: WeightUpdates | None = None  # weight_transfer_config
    state_cache: HpuStateCache | None = None  # a hybrid's Mamba2 / GDN layers

    def before_update(self, scheduler_output: SchedulerOutput) -> None:
        """A step's hook before the request states take its changes."""
        if self.kv_connector is not None:
            self.kv_connector.before_update(scheduler_output)
        if self.pooler is not None:
            self.pooler.prepare_new_requests(scheduler_output)
        if self.async_feed is not None:
            self.async_feed.before_update(scheduler_output)
        if self.state_cache is not None:
            self.state_cache.before_update(scheduler_output)

    def after_update(
        self,
        scheduler_output: SchedulerOutput,
        requests: Mapping[str, CachedRequestState],
    ) -> None:
        """A step's hook after the request states took its changes."""
        if self.multimodal is not None:
            self.multimodal.update(scheduler_output)
        if self.spec is not None:
            self.spec.update(scheduler_output, requests)
        if self.state_cache is not None:
            self.state_cache.after_update()

    def kv_connector_step(
        self, scheduler_output: SchedulerOutput
    ) -> AbstractContextManager[None]:
        """Around a step's passes: a KV connector's loads before, saves after
        (connectors run in synchronous steps: the passes are done on exit)."""
        if self.kv_connector is None:
            return contextlib.nullcontext()
        return self.kv_connector.step(scheduler_output)

    def kv_connector_output(self) -> KVConnectorOutput | None:
        """The last step's transfers, for its runner output."""
        return self.kv_connector.take_output() if self.kv_connector else None

    def no_forward_output(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """A step without tokens: empty, but for a KV connector's transfers."""
        if self.kv_connector is None:
            return EMPTY_MODEL_RUNNER_OUTPUT
        return self.kv_connector.no_forward_output(scheduler_output)

    def model_inputs(self, forward_pass: ForwardPass) -> dict[str, Any]:
        """A pass's positions ([num_tokens], or [3, num_tokens] for M-RoPE) and
        token ids, or for a multimodal model input embeddings on every pass
        (encoder outputs merged in), so each bucket compiles one graph."""
        inputs: dict[str, Any] = {"positions": forward_pass.positions}
        if self.mrope is not None:
            inputs["positions"] = self.mrope.positions(forward_pass)
        if self.multimodal is None:
            return inputs | {"input_ids": forward_pass.input_ids}
        with self.profiler.span("embed", bucket=forward_pass.bucket):
            embeds = self.multimodal.embed(forward_pass)
        return inputs | {"input_ids": None, "inputs_embeds": embeds}


def build_capabilities(
    runner: TargetRunner, sampler: Sampler, stream: DeviceStream
) -> Capabilities:
    """The parts the configuration asks for, before the model is loaded."""
    vllm_config = runner.vllm_config
    input_batch = runner.input_batch
    envs = get_envs()
    rank = vllm_config.parallel_config.rank
    is_async = bool(vllm_config.scheduler_config.async_scheduling)
    # Every rank plans the same passes: the first one writes the trace.
    records = envs.bucket_trace and rank == 0
    return Capabilities(
        spec=(
            SpecDecoder(runner, sampler)
            if vllm_config.speculative_config is not None
            else None
        ),
        lora=HpuLoRA(vllm_config, input_batch) if vllm_config.lora_config else None,
        inc=IncFlow.from_config(vllm_config),
        async_feed=(
            AsyncTokenFeed(input_batch, runner.states, stream) if is_async else None
        ),
        profiler=StepProfiler(envs.profiler_enabled, envs.profile_dir, rank),
        step_trace=TraceRecorder(Path(envs.bucket_trace)) if records else None,
        kv_connector=(
            KVConnectorSteps(vllm_config) if has_kv_connector(vllm_config) else None
        ),
        sleep=(
            HpuSleepMode(vllm_config.model_config.sleep_preserve_parameter_names)
            if vllm_config.model_config.enable_sleep_mode
            else None
        ),
        data_parallel=(
            DataParallelPasses(
                runner.buckets,
                vllm_config.parallel_config.data_parallel_rank,
                vllm_config.parallel_config.data_parallel_size,
            )
            if exchanges_tokens(vllm_config)
            else None
        ),
    )


def attach_model(
    capabilities: Capabilities, runner: TargetRunner, is_first_stage: bool
) -> None:
    """The parts the loaded model asks for."""
    model = runner.get_model()
    model_config = runner.vllm_config.model_config
    requests = runner.states.requests
    capabilities.mrope = mrope_positions_for(
        model, model_config, runner.input_batch, requests
    )
    if model_config.runner_type == "pooling":
        capabilities.pooler = StepPooler(runner.input_batch, model, model_config)
    if runner.vllm_config.weight_transfer_config is not None:
        rank = runner.vllm_config.parallel_config.rank
        capabilities.weight_updates = WeightUpdates(
            runner.vllm_config, runner.device, model, capabilities.sleep, rank
        )
    capabilities.state_cache = _state_cache(runner)
    # A multimodal model with every modality limited to 0 runs as a text model.
    takes_media = supports_multimodal(model) and model_config.supports_multimodal_inputs
    if takes_media and is_first_stage:
        capabilities.multimodal = MultimodalInputs(
            runner.vllm_config, model, runner.input_batch, requests, runner.device
        )


def _state_cache(runner: TargetRunner) -> HpuStateCache | None:
    """A hybrid model's state slots, for its Mamba2 / linear-attention layers."""
    vllm_config = runner.vllm_config
    layers = get_layers_from_vllm_config(vllm_config, MambaBase)  # type: ignore[type-abstract]
    if not layers:
        return None
    specs = {}
    for name, layer in layers.items():
        spec = layer.get_kv_cache_spec(vllm_config)
        assert isinstance(spec, MambaSpec), f"{name}: {spec}"
        specs[name] = spec
    return HpuStateCache(
        layers,
        specs,
        runner.input_batch,
        vllm_config.scheduler_config.max_num_seqs,
        runner.device,
        prefix_caching=vllm_config.cache_config.mamba_cache_mode == "align",
        num_speculative_tokens=vllm_config.num_speculative_tokens,
    )
