"""HpuWorker: the process-level half of the plugin, driven by vLLM's engine core:
the device, the distributed group and the memory split; steps go to the runner."""

import atexit
import gc
import multiprocessing
import signal
import threading
import time
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorHandshakeMetadata,
)
from vllm.logger import init_logger
from vllm.lora.request import LoRARequest
from vllm.sequence import IntermediateTensors
from vllm.tasks import SupportedTask
from vllm.utils.mem_utils import format_gib
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec
from vllm.v1.outputs import AsyncModelRunnerOutput, DraftTokenIds, ModelRunnerOutput
from vllm.v1.worker.gpu_worker import init_worker_distributed_environment
from vllm.v1.worker.worker_base import CompilationTimes, WorkerBase

from vllm_hpu import device
from vllm_hpu.distributed.host_network import choose_gloo_interface
from vllm_hpu.envs import fail_if_injected, get_envs
from vllm_hpu.kv_transfer.connectors import check_worker_config
from vllm_hpu.worker.capabilities import kv_connector, pipeline
from vllm_hpu.worker.capabilities.pooling import supported_pooling_tasks
from vllm_hpu.worker.capabilities.sleep import HpuSleepMode
from vllm_hpu.worker.capabilities.weight_updates import (
    WeightUpdates,
    reload_model_weights,
)
from vllm_hpu.worker.diagnostics.compile_stats import StepCompilations
from vllm_hpu.worker.diagnostics.fallback_stats import StepFallbacks
from vllm_hpu.worker.diagnostics.metrics import HpuMetrics
from vllm_hpu.worker.model_runner import HpuModelRunner
from vllm_hpu.worker.warmup.memory import MemorySplit, split_memory
from vllm_hpu.worker.warmup.warmup import warm_up_model

logger = init_logger("vllm.hpu.worker")


class HpuWorker(WorkerBase):
    def __init__(
        self,
        vllm_config: VllmConfig,
        local_rank: int,
        rank: int,
        distributed_init_method: str,
        is_driver_worker: bool = False,
    ):
        super().__init__(
            vllm_config, local_rank, rank, distributed_init_method, is_driver_worker
        )
        self.model_runner: HpuModelRunner | None = None  # type: ignore[assignment]
        self.memory_split: MemorySplit | None = None
        envs = get_envs()
        self.compilations = StepCompilations(
            envs.log_step_graph_compilation, envs.log_step_graph_compilation_all
        )
        self.fallbacks = StepFallbacks(
            envs.log_step_cpu_fallbacks, envs.log_step_cpu_fallbacks_all
        )
        self.metrics: HpuMetrics | None = None
        # Asleep only if enable_sleep_mode lets the RPCs through.
        self.sleep_mode = HpuSleepMode(self.model_config.sleep_preserve_parameter_names)
        self.weight_updates: WeightUpdates | None = None  # set by load_model

    @property
    def runner(self) -> HpuModelRunner:
        assert self.model_runner is not None, "init_device() first"
        return self.model_runner

    def init_device(self) -> None:
        check_worker_config(self.vllm_config)  # a KV connector, before any load
        self.device = torch.device(device.device_type())
        device.set_device(self.device)
        device.init_device_memory()
        choose_gloo_interface()  # before gloo forms the process groups
        init_worker_distributed_environment(
            self.vllm_config,
            self.rank,
            self.distributed_init_method,
            self.local_rank,
            device.dist_backend(),
        )
        set_random_seed(self.model_config.seed)
        self.model_runner = HpuModelRunner(self.vllm_config, self.device)

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        fail_if_injected("model_load")
        if load_dummy_weights:
            self.load_config.load_format = "dummy"
        self.runner.load_model()
        if self.vllm_config.weight_transfer_config is not None:
            self.weight_updates = WeightUpdates(
                self.vllm_config,
                self.runner.device,
                self.runner.get_model(),
                self.sleep_mode,
                self.vllm_config.parallel_config.rank,
            )

    def get_model(self) -> torch.nn.Module:
        return self.runner.get_model()

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        return self.runner.get_kv_cache_spec()

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        return self.runner.take_draft_token_ids()

    def determine_available_memory(self) -> int:
        """Bytes for the KV cache: an explicit size, or the documented split, less a
        hybrid model's state slots and checkpoints (the runner allocates those)."""
        return self.runner.kv_cache_share(self._kv_cache_bytes())

    def _kv_cache_bytes(self) -> int:
        explicit = self.cache_config.kv_cache_memory_bytes
        if explicit is not None:
            logger.info(
                "Using %s GiB for the KV cache (kv_cache_memory_bytes).",
                format_gib(explicit),
            )
            return explicit
        self.runner.profile_run()
        free, _ = device.mem_get_info()
        self.memory_split = split_memory(
            free, self.cache_config.gpu_memory_utilization, self._graph_reserved_mem()
        )
        logger.info(
            self.memory_split.describe(
                self.cache_config.gpu_memory_utilization, self._graph_reserved_mem()
            )
        )
        return self.memory_split.kv_cache

    def _graph_reserved_mem(self) -> float:
        """Graphs are never captured in eager mode, so they get no memory there."""
        return 0.0 if self.model_config.enforce_eager else get_envs().graph_reserved_mem

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:
        # The connector exists before the caches it registers (vLLM's order).
        kv_connector.initialize_kv_transfer(self.vllm_config, kv_cache_config)
        fail_if_injected("kv_allocation")
        self.runner.initialize_kv_cache(kv_cache_config)

    def get_kv_connector_handshake_metadata(
        self,
    ) -> dict[tuple[int, int], KVConnectorHandshakeMetadata] | None:
        return kv_connector.kv_connector_handshake_metadata()

    def compile_or_warm_up_model(self) -> CompilationTimes:
        started = time.perf_counter()
        fail_if_injected("warmup")
        warm_up_model(self.runner, self._graph_mem())
        self.runner.start_serving()
        # The seed is reset so that profiling does not shift seeded sampling.
        set_random_seed(self.model_config.seed)
        elapsed = time.perf_counter() - started
        return CompilationTimes(language_model=elapsed, encoder=0.0)

    def _graph_mem(self) -> int:
        """Bytes for graphs: the split's share (of free memory, with a KV size set)."""
        if self.memory_split is not None:
            return self.memory_split.graph
        free, _ = device.mem_get_info()
        utilization = self.cache_config.gpu_memory_utilization
        return split_memory(free, utilization, self._graph_reserved_mem()).graph

    def get_supported_tasks(self) -> tuple[SupportedTask, ...]:
        if self.model_config.runner_type == "pooling":
            return tuple(supported_pooling_tasks(self.runner.get_model()))
        return ("generate",)

    def execute_model(
        self, scheduler_output: SchedulerOutput
    ) -> ModelRunnerOutput | None:
        if self.metrics is None and self.rank == 0:
            # From the first step (end of warmup); rank 0 only: all ranks pad alike.
            self.metrics = HpuMetrics(self.runner.buckets)
        received = None
        stage = self.runner.stage
        if scheduler_output.total_num_scheduled_tokens:
            fail_if_injected("first_step")
        if scheduler_output.total_num_scheduled_tokens and not stage.is_first:
            received = pipeline.receive()
        with self.compilations.step(), self.fallbacks.step():
            output = self.runner.execute_model(scheduler_output, received)
        if self.metrics is not None:
            self.metrics.observe_step()
        if isinstance(output, IntermediateTensors):
            pipeline.send(output)
            return None
        if output is not None:  # a step without sampling (pooling, no tokens)
            self.runner.end_engine_step()
        return output

    def execute_dummy_batch(self) -> None:
        self.runner.execute_dummy_batch()
        self.runner.end_engine_step(is_dummy=True)

    def sample_tokens(
        self, grammar_output: GrammarOutput | None
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        output = self.runner.sample_tokens(grammar_output)
        self.runner.end_engine_step()
        return output

    def synchronize_device(self) -> None:
        device.synchronize()

    def get_cache_block_size_bytes(self) -> int:
        specs = self.get_kv_cache_spec().values()
        return sum(spec.page_size_bytes for spec in specs)

    def add_lora(self, lora_request: LoRARequest) -> bool:
        return self.runner.lora_adapters().add_lora(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        return self.runner.lora_adapters().remove_lora(lora_id)

    def pin_lora(self, lora_id: int) -> bool:
        return self.runner.lora_adapters().pin_lora(lora_id)

    def list_loras(self) -> set[int]:
        return self.runner.lora_adapters().list_loras()

    def reset_encoder_cache(self) -> None:
        """Forget encoder outputs, as vLLM's scheduler does (pause, sleep)."""
        self.runner.reset_encoder_cache()

    # ---- RL frameworks: sleep mode (capabilities/sleep.py) and weight
    # updates (capabilities/weight_updates.py) ----

    def sleep(self, level: int = 1) -> None:
        sleep = self._sleep_mode()
        self.runner.synchronize()
        used_before = device.memory_used()
        sleep.sleep(level, [self.runner.get_model()], self.runner.release_kv_cache)
        used_after = device.memory_used()
        logger.info(
            "Sleep mode (level %d) freed %s GiB of device memory; %s GiB still in use.",
            level,
            format_gib(max(0, used_before - used_after)),
            format_gib(used_after),
        )

    def wake_up(self, tags: list[str] | None = None) -> None:
        self._sleep_mode().wake_up(tags, self.runner.restore_kv_cache)

    def discard(self, tags: tuple[str, ...]) -> None:
        self.runner.synchronize()
        self._sleep_mode().discard(tags, self.runner.release_kv_cache)

    def _sleep_mode(self) -> HpuSleepMode:
        if not self.model_config.enable_sleep_mode:
            raise RuntimeError("Sleep mode is off: start vLLM with enable_sleep_mode.")
        return self.sleep_mode

    def reload_weights(self, **kwargs: Any) -> None:
        self.sleep_mode.check_awake("reload_weights")
        runner = self.runner
        runner.synchronize()  # queued passes read the weights
        reload_model_weights(
            self.vllm_config, runner.get_model(), runner.packed_weights, **kwargs
        )

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._weight_updates().init_engine(init_info)

    def shutdown_weight_transfer_engine(self) -> None:
        if self.weight_updates is not None:
            self.weight_updates.shutdown()

    def start_weight_update(self) -> None:
        self.runner.synchronize()  # queued passes read the weights
        self._weight_updates().start()

    def update_weights(
        self, update_info: dict[str, Any] | list[dict[str, Any]]
    ) -> None:
        self._weight_updates().update(update_info)

    def finish_weight_update(self) -> None:
        self._weight_updates().finish()

    def _weight_updates(self) -> WeightUpdates:
        """The trainer's engine, as vLLM's GPU worker keeps it."""
        if self.weight_updates is None:
            raise RuntimeError(
                "Weight transfer is not configured: start vLLM with "
                "weight_transfer_config={'backend': 'hpu'}."
            )
        return self.weight_updates

    def check_health(self) -> None:
        return

    def shutdown_inc(self) -> None:
        """Write INC's measurements (MEASURE): ``collective_rpc("shutdown_inc")``."""
        if self.model_runner is not None:
            self.model_runner.shutdown_inc()

    def shutdown(self) -> None:
        if self.model_runner is not None:
            self.model_runner.shutdown()
        if self.weight_updates is not None:
            self.weight_updates.engine.shutdown()
        if self.metrics is not None:
            self.metrics.log()
        kv_connector.shutdown_kv_transfer()
        _exit_quickly()


def _exit_quickly() -> None:
    """In an engine process vLLM started, the heap (~1M objects) skips Python's exit
    collection: 3-5 s on a busy core, past vLLM's 5 s grace (as vLLM on ROCm). A
    second stop signal (Ctrl-C, then the API server's) no longer interrupts the
    exit, which left "leaked semaphore objects". In-process engines: untouched."""
    if multiprocessing.parent_process() is None:
        return
    atexit.register(gc.freeze)
    if threading.current_thread() is threading.main_thread():
        for stop in (signal.SIGINT, signal.SIGTERM):
            signal.signal(stop, signal.SIG_IGN)
