"""Every optional part of the runner, constructed here and nowhere else.

``build_capabilities`` makes what the configuration alone decides (with the
runner); ``attach_model`` what depends on the loaded model. A part nobody asked
for is its base class, whose calls do nothing (vLLM's v2 runner style): the
runner calls every part at its hook points (``before_update``,
``after_update``, ``model_inputs`` here; the rest in model_runner.py) without
asking whether it exists. docs/architecture.md, "Where a new capability plugs
in", lists the hooks.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm.config import get_layers_from_vllm_config
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.model_executor.models.interfaces import supports_multimodal
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import MambaSpec
from vllm.v1.sample.sampler import Sampler
from vllm.v1.worker.gpu_input_batch import CachedRequestState

from vllm_hpu.emulation.device_stream import DeviceStream
from vllm_hpu.envs import get_envs
from vllm_hpu.quantization.inc_flow import QuantizationFlow, quantization_flow
from vllm_hpu.worker.capabilities.data_parallel import (
    DataParallelPasses,
    PassAlignment,
    exchanges_tokens,
)
from vllm_hpu.worker.capabilities.eplb import ExpertBalancing, HpuEplb
from vllm_hpu.worker.capabilities.kv_connector import KVConnectorSteps
from vllm_hpu.worker.capabilities.lora import HpuLoRA, LoRAAdapters
from vllm_hpu.worker.capabilities.mrope import FlatPositions, mrope_positions_for
from vllm_hpu.worker.capabilities.multimodal import MultimodalInputs, TextInputs
from vllm_hpu.worker.capabilities.pooling import Pooling, StepPooler
from vllm_hpu.worker.capabilities.routed_experts import (
    RoutedExpertsCapture,
    RoutedExpertsOutput,
)
from vllm_hpu.worker.capabilities.state_cache import HpuStateCache, StateCache
from vllm_hpu.worker.diagnostics.profiler import StepProfiler
from vllm_hpu.worker.passes.forward_pass import ForwardPass
from vllm_hpu.worker.spec_decode.decoder import SpecDecoder, SpecDecoding
from vllm_hpu.worker.spec_decode.interface import TargetRunner
from vllm_hpu.worker.state.async_output import AsyncTokenFeed, TokenFeed


@dataclass
class Capabilities:
    """Each part is always there: where the configuration or the model does
    not ask for it, its base class, whose calls do nothing."""

    lora: LoRAAdapters  # HpuLoRA with --enable-lora
    spec: SpecDecoding  # SpecDecoder with --speculative-config
    inc: QuantizationFlow  # IncFlow with --quantization inc / QUANT_CONFIG
    # Async scheduling: step N's tokens reach step N+1 on the device.
    async_feed: TokenFeed
    profiler: StepProfiler  # VLLM_PROFILER_ENABLED (a no-op otherwise)
    # --kv-transfer-config, --kv-offloading-size
    kv_connector: KVConnectorSteps
    # --data-parallel-size with a MoE model: as many passes as the other ranks.
    data_parallel: PassAlignment
    eplb: ExpertBalancing  # HpuEplb with --enable-eplb
    # Set by ``attach_model``:
    pooler: Pooling = field(default_factory=Pooling)  # a pooling model
    # A model taking media, on the first pipeline stage.
    multimodal: TextInputs = field(default_factory=TextInputs)
    mrope: FlatPositions = field(default_factory=FlatPositions)  # M-RoPE models
    # A hybrid's Mamba2 / GDN layers.
    state_cache: StateCache = field(default_factory=StateCache)
    # enable_return_routed_experts: each token's experts back with the output.
    routed_experts: RoutedExpertsOutput = field(default_factory=RoutedExpertsOutput)

    def before_update(self, scheduler_output: SchedulerOutput) -> None:
        """A step's hook before the request states take its changes."""
        self.kv_connector.before_update(scheduler_output)
        self.pooler.prepare_new_requests(scheduler_output)
        self.async_feed.before_update(scheduler_output)
        self.state_cache.before_update(scheduler_output)

    def after_update(
        self,
        scheduler_output: SchedulerOutput,
        requests: Mapping[str, CachedRequestState],
    ) -> None:
        """A step's hook after the request states took its changes."""
        self.multimodal.update(scheduler_output)
        self.spec.update(scheduler_output, requests)
        self.state_cache.after_update()
        self.routed_experts.begin_step(scheduler_output)

    def model_inputs(self, forward_pass: ForwardPass) -> dict[str, Any]:
        """A pass's positions ([num_tokens], or [3, num_tokens] for M-RoPE) and
        token ids, or for a multimodal model input embeddings."""
        inputs = self.multimodal.inputs(forward_pass)
        return inputs | {"positions": self.mrope.positions(forward_pass)}


def build_capabilities(
    runner: TargetRunner, sampler: Sampler, stream: DeviceStream
) -> Capabilities:
    """The parts the configuration asks for, before the model is loaded."""
    vllm_config = runner.vllm_config
    input_batch = runner.input_batch
    envs = get_envs()
    parallel = vllm_config.parallel_config
    is_async = bool(vllm_config.scheduler_config.async_scheduling)
    return Capabilities(
        spec=(
            SpecDecoder(runner, sampler)
            if vllm_config.speculative_config is not None
            else SpecDecoding(input_batch, sampler)
        ),
        lora=(
            HpuLoRA(vllm_config, input_batch)
            if vllm_config.lora_config
            else LoRAAdapters()
        ),
        inc=quantization_flow(vllm_config),
        async_feed=(
            AsyncTokenFeed(input_batch, runner.states, stream)
            if is_async
            else TokenFeed()
        ),
        profiler=StepProfiler(envs.profiler_enabled, envs.profile_dir, parallel.rank),
        kv_connector=KVConnectorSteps(vllm_config),
        data_parallel=(
            DataParallelPasses(
                runner.buckets,
                parallel.data_parallel_rank,
                parallel.data_parallel_size,
            )
            if exchanges_tokens(vllm_config)
            else PassAlignment()
        ),
        eplb=(
            HpuEplb(vllm_config, runner.device, stream)
            if vllm_config.parallel_config.enable_eplb
            else ExpertBalancing()
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
    capabilities.state_cache = _state_cache(runner)
    if runner.vllm_config.aux_output_config.enable_return_routed_experts:
        capabilities.routed_experts = RoutedExpertsCapture(
            runner.vllm_config, model, runner.input_batch
        )
    # A multimodal model with every modality limited to 0 runs as a text model.
    takes_media = supports_multimodal(model) and model_config.supports_multimodal_inputs
    if takes_media and is_first_stage:
        capabilities.multimodal = MultimodalInputs(
            runner.vllm_config,
            model,
            runner.input_batch,
            requests,
            runner.device,
            capabilities.profiler,
        )


def _state_cache(runner: TargetRunner) -> StateCache:
    """A hybrid model's state slots, for its Mamba2 / linear-attention layers."""
    vllm_config = runner.vllm_config
    layers = get_layers_from_vllm_config(vllm_config, MambaBase)  # type: ignore[type-abstract]
    if not layers:
        return StateCache()
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
    )
