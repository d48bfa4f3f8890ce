"""HpuPlatform: how vLLM sees Gaudi, or the CPU in emulation. Identity is class
attributes from ``device.py``; ``check_and_update_config`` has numbered steps."""

from typing import TYPE_CHECKING

import torch
from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum

from vllm_hpu import device, envs
from vllm_hpu.config import refusals
from vllm_hpu.config.hybrid import configure_hybrid
from vllm_hpu.kv_transfer import blocks
from vllm_hpu.kv_transfer.connectors import (
    HOST_BUFFER_DEVICE,
    SYNCHRONOUS_STEPS,
    has_kv_connector,
    resolve_kv_transfer_config,
)
from vllm_hpu.patches import engine_args, engine_failures
from vllm_hpu.quantization.checkpoints import (
    check_checkpoint_quantized,
    check_quant_config,
    method_refusal,
)
from vllm_hpu.quantization.inc import apply_fp8_options

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.attention.backend import AttentionBackend
    from vllm.v1.attention.backends.mla.prefill.base import MLAPrefillBackend
    from vllm.v1.attention.backends.mla.prefill.selector import (
        MLAPrefillSelectorConfig,
    )
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

logger = init_logger("vllm.hpu.platform")

DEFAULT_BLOCK_SIZE = 128
WORKER_CLS = "vllm_hpu.worker.hpu_worker.HpuWorker"
ATTN_BACKEND_CLS = "vllm_hpu.attention.backend.HpuAttentionBackend"
MLA_BACKEND_CLS = "vllm_hpu.attention.mla.HpuMLABackend"
SPARSE_MLA_BACKEND_CLS = "vllm_hpu.attention.sparse_mla.HpuSparseMLABackend"


class HpuPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "hpu"
    device_type: str = device.device_type()
    dispatch_key: str = "HPU" if device.hpu_available() else "CPU"
    dist_backend: str = device.dist_backend()
    # Also in emulation: Ray forbids "CPU" as a custom resource and vLLM reads the
    # key back from Ray's accelerator ids, so emulated cards are declared as "HPU".
    ray_device_key: str = "HPU"
    device_control_env_var: str = "HABANA_VISIBLE_MODULES"
    simple_compile_backend: str = device.compile_backend()
    supported_quantization: list[str] = [
        "fp8",
        "inc",
        "awq",
        "gptq",
        "compressed-tensors",
        "gpt_oss_mxfp4",
    ]
    additional_env_vars: list[str] = envs.variable_names()

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        # Sliding-window layers in KV cache groups of their own; step 6c may undo it.
        return True

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        """bf16 first: vLLM's "auto" runs float32 checkpoints in it. float16 runs
        as asked (or as vLLM's "auto" keeps a float16 checkpoint)."""
        return [torch.bfloat16, torch.float32, torch.float16]

    @classmethod
    def get_attn_backend_cls(
        cls,
        selected_backend: "AttentionBackendEnum",
        attn_selector_config: "AttentionSelectorConfig",
        num_heads: int | None = None,
    ) -> str:
        if attn_selector_config.use_mla:
            from vllm_hpu.attention.mla import check_mla_supported

            check_mla_supported(attn_selector_config)
            if attn_selector_config.use_sparse:
                return SPARSE_MLA_BACKEND_CLS
            return MLA_BACKEND_CLS
        from vllm_hpu.attention.backend import check_supported

        check_supported(attn_selector_config)
        return ATTN_BACKEND_CLS

    @classmethod
    def get_mla_prefill_backend_cls(
        cls, mla_selector_config: "MLAPrefillSelectorConfig"
    ) -> "type[MLAPrefillBackend]":
        from vllm_hpu.attention.mla import HpuMLAPrefillBackend

        return HpuMLAPrefillBackend

    @classmethod
    def verify_quantization(cls, quant: str) -> None:
        """vLLM's check of the method, with the plugin's words where it has more
        to say (``mxfp4`` outside gpt-oss's own checkpoints)."""
        refusal = method_refusal(quant)
        if refusal is not None:
            raise ValueError(refusal)
        super().verify_quantization(quant)

    @classmethod
    def _preferred_block_size_for_backends(
        cls,
        backend_classes: "list[type[AttentionBackend]]",
        default_block_size: int,
        vllm_config: "VllmConfig",
    ) -> int:
        """The backends' common preference: for several backends (Llama 4's chunked
        layers subclass ours) vLLM falls back to 16, not the runner's 128."""
        preferred = {
            b.get_preferred_block_size(default_block_size) for b in backend_classes
        }
        if len(preferred) == 1:
            return preferred.pop()
        return super()._preferred_block_size_for_backends(
            backend_classes, default_block_size, vllm_config
        )

    @classmethod
    def import_kernels(cls) -> None:
        """None of vLLM's compiled kernels (``vllm._C``: CUDA's, or absent); the
        plugin runs its own. vLLM's default warns "Failed to import from vllm._C"."""

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return device.device_name()

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return device.total_memory()

    @classmethod
    def set_device(cls, torch_device: torch.device) -> None:
        device.set_device(torch_device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        device.manual_seed_all(seed)

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        # Pinned host buffers only pay off with a real device behind them.
        return device.hpu_available()

    @classmethod
    def get_current_memory_usage(
        cls, torch_device: torch.types.Device | None = None
    ) -> float:
        return float(device.memory_used())

    def is_sleep_mode_available(self) -> bool:
        """Sleep mode is the worker's (capabilities/sleep.py), not vLLM's allocator."""
        return True

    @classmethod
    def get_punica_wrapper(cls) -> str:
        return "vllm_hpu.ops.punica.HpuPunicaWrapper"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "vllm_hpu.distributed.communicator.HpuCommunicator"

    @classmethod
    def use_sync_weight_loader(cls) -> bool:
        return True

    @classmethod
    def make_synced_weight_loader(cls, original_weight_loader):  # type: ignore[no-untyped-def]
        """Each device parameter's copy finishes before the next loads (as the reference
        does): a device sync, not vLLM's ``torch._sync`` (XLA's, asserts on an HPU
        tensor); host and meta parameters (online quantization) need nothing."""

        def synced_weight_loader(param, *args, **kwargs):  # type: ignore[no-untyped-def]
            out = original_weight_loader(param, *args, **kwargs)
            if param.device.type not in ("cpu", "meta"):
                device.synchronize()
            return out

        return synced_weight_loader

    @classmethod
    def inference_mode(cls):  # type: ignore[no-untyped-def]
        return torch.no_grad()

    @classmethod
    def get_nixl_supported_devices(cls) -> dict[str, tuple[str, ...]]:
        """NIXL reads HPU KV from a host buffer (emulation: "cpu" is vLLM's)."""
        return {"hpu": (HOST_BUFFER_DEVICE,)}

    @classmethod
    def get_nixl_memory_type(cls) -> str:
        return "DRAM"

    @classmethod
    def discover_numa_topology(cls) -> list[list[int]]:
        """No cores reserved for NIXL in emulation (its worker pins itself to these when
        the device type is "cpu"): the emulated device needs every core."""
        return []

    @classmethod
    def insert_blocks_to_device(
        cls,
        src_cache: torch.Tensor,
        dst_cache: torch.Tensor,
        src_block_indices: torch.Tensor,
        dst_block_indices: torch.Tensor,
    ) -> None:
        blocks.copy_blocks(src_cache, dst_cache, src_block_indices, dst_block_indices)

    swap_out_blocks_to_host = insert_blocks_to_device  # the same copy, host-bound

    @classmethod
    def validate_environ(cls, hard_fail: bool) -> None:
        """vLLM's unknown-variable check, leaving out the variables we own."""
        from vllm import envs as vllm_envs
        from vllm.utils.torch_utils import OMP_NUM_THREADS_SET_BY_VLLM

        # vLLM sets this marker for its own worker processes without declaring it.
        known = {*vllm_envs.environment_variables, OMP_NUM_THREADS_SET_BY_VLLM}
        unknown = envs.unknown_vllm_variables(envs.process_environ(), known)
        for name in unknown:
            if hard_fail:
                raise ValueError(f"Unknown vLLM environment variable detected: {name}")
            logger.warning("Unknown vLLM environment variable detected: %s", name)

    @classmethod
    def apply_config_platform_defaults(cls, vllm_config: "VllmConfig") -> None:
        """The user's compilation settings, before vLLM's defaults."""
        from vllm_hpu.config.compilation import apply_user_compilation

        apply_user_compilation(vllm_config)

    @classmethod
    def check_and_update_config(cls, vllm_config: "VllmConfig") -> None:
        """Runs on every ``VllmConfig.__post_init__`` pass (caller's, then the core's)
        and gives the same config twice: it reads ``engine_args.requested_options``,
        not fields an earlier pass changed, and marks decisions taken once there."""
        requested = engine_args.requested_options(vllm_config)
        _check_envs()  # 0. a malformed variable stops start-up here
        if engine_args.first_pass(vllm_config, "failure notes"):
            engine_failures.prepare_failure_notes()  # the caller's: why its engine died
        _fail_on_the_engine_cores_pass(vllm_config)  # a test hook
        _use_our_worker(vllm_config)  # 1.
        _set_block_size(vllm_config)  # 2.
        _disable_vllm_compilation(vllm_config)  # 3.
        check_checkpoint_quantized(vllm_config.model_config)  # 4. before weights load
        check_quant_config(vllm_config.quant_config)  # 4.
        _use_fast_cpu_dtype(vllm_config, requested)  # 4b. emulation's default dtype
        _disable_unsupported_scheduling(vllm_config, requested)  # 5.
        refusals.reject_unsupported_features(vllm_config)  # 6.
        resolve_kv_transfer_config(vllm_config)  # 6b. KV connectors we run
        _choose_kv_cache_manager(vllm_config, requested)  # 6c. windows free blocks
        _spawn_processes()  # 7.
        _use_hpu_ray_executor(vllm_config)  # 8.
        refusals.reject_split_pooled_prompts(vllm_config)  # 9.
        refusals.reject_unsupported_model(vllm_config)  # 10.
        configure_hybrid(vllm_config, cls)  # 10b. one state per request
        apply_fp8_options(vllm_config)  # 11.


def _check_envs() -> None:
    """Parse every variable now; name the reference's ones that do nothing here."""
    for note in envs.no_effect_notes(envs.get_envs()):
        logger.info_once(note)


def _fail_on_the_engine_cores_pass(vllm_config: "VllmConfig") -> None:
    """VLLM_HPU_FAIL_AT=config: the engine core's config pass fails after it told the
    caller it is ready (the caller's pass marks the config)."""
    if envs.get_envs().fail_at != "config":
        return
    if not engine_args.first_pass(vllm_config, "injected config failure"):
        envs.fail_if_injected("config")


def _spawn_processes() -> None:
    """Engine and worker processes start with spawn, as on vLLM's CPU backend: a
    process forked after torch ran work (a thread pool started) can hang."""
    if envs.set_default("VLLM_WORKER_MULTIPROC_METHOD", "spawn") != "spawn":
        logger.warning_once(
            "VLLM_WORKER_MULTIPROC_METHOD is not spawn: an engine forked from a "
            "process that already ran torch work can hang at start-up."
        )


def _use_hpu_ray_executor(vllm_config: "VllmConfig") -> None:
    """Ray's executor, starting Ray with the emulated HPUs declared and failing at
    once when the cluster has too few HPUs (vLLM would wait 30 minutes)."""
    parallel_config = vllm_config.parallel_config
    if parallel_config.distributed_executor_backend == "ray":
        from vllm_hpu.distributed.ray_cluster import hpu_ray_executor

        parallel_config.distributed_executor_backend = hpu_ray_executor()


def _use_our_worker(vllm_config: "VllmConfig") -> None:
    parallel_config = vllm_config.parallel_config
    if parallel_config.worker_cls == "auto":
        parallel_config.worker_cls = WORKER_CLS


def _set_block_size(vllm_config: "VllmConfig") -> None:
    cache_config = vllm_config.cache_config
    if not cache_config.user_specified_block_size:
        cache_config.block_size = DEFAULT_BLOCK_SIZE


def _disable_vllm_compilation(vllm_config: "VllmConfig") -> None:
    """Our runner compiles per bucket itself; vLLM's graph modes do not apply
    (what the user asked for was weighed in ``apply_config_platform_defaults``)."""
    from vllm.config import CompilationMode, CUDAGraphMode

    compilation_config = vllm_config.compilation_config
    compilation_config.mode = CompilationMode.NONE
    compilation_config.cudagraph_mode = CUDAGraphMode.NONE
    compilation_config.cudagraph_capture_sizes = []
    compilation_config.custom_ops = ["all"]


def _use_fast_cpu_dtype(
    vllm_config: "VllmConfig", requested: engine_args.RequestedOptions
) -> None:
    """Emulation, unquantized models only: dtype "auto" becomes the one this CPU runs
    fast; an explicit --dtype is honoured. Quantized and INC models keep vLLM's
    choice, the 16-bit dtype their kernels were validated in."""
    model_config = vllm_config.model_config
    if device.hpu_available() or not requested.dtype_auto:
        return
    if model_config is None or model_config.quantization:
        return
    if envs.get_envs().quant_config:
        return
    if not engine_args.first_pass(vllm_config, "emulation dtype"):
        return  # chosen, and said, on the caller's pass
    fast, chosen = device.fast_dtype(), model_config.dtype
    logger.info_once(
        "Emulation runs the model in %s%s by default: this CPU %s bf16 "
        "instructions (AVX-512 BF16 or AMX) for oneDNN's packed bf16 matmuls; "
        "--dtype chooses another.",
        fast,
        "" if chosen == fast else f" (not {chosen})",
        "has" if device.cpu_has_bf16_instructions() else "has no",
    )
    if chosen == fast:
        return
    model_config.dtype = fast
    # vLLM copied the model's dtype into these before this hook ran.
    lora_config = vllm_config.lora_config
    if lora_config is not None and lora_config.lora_dtype == chosen:
        lora_config.lora_dtype = fast
    speculative = vllm_config.speculative_config
    draft = speculative.draft_model_config if speculative else None
    if draft is not None and draft.dtype == chosen:
        draft.dtype = fast


def _disable_unsupported_scheduling(
    vllm_config: "VllmConfig", requested: engine_args.RequestedOptions
) -> None:
    """Async scheduling where the runner supports it; the log says which is in
    force and why (the CLI, VLLM_DELAYED_SAMPLING or vLLM's default), once."""
    scheduler_config = vllm_config.scheduler_config
    why_not = _why_not_async(vllm_config)
    first_pass = engine_args.first_pass(vllm_config, "async scheduling")
    if scheduler_config.async_scheduling and why_not:
        logger.info("Async scheduling disabled: %s.", why_not)
        scheduler_config.async_scheduling = False
        return
    if not first_pass:
        return
    state = "on" if scheduler_config.async_scheduling else "off"
    logger.info("Async scheduling %s (%s).", state, requested.async_scheduling_source)


def _why_not_async(vllm_config: "VllmConfig") -> str | None:
    if vllm_config.speculative_config is not None:
        return "the HPU runner does not combine it with speculative decoding yet"
    if has_kv_connector(vllm_config):
        return SYNCHRONOUS_STEPS
    if vllm_config.parallel_config.pipeline_parallel_size > 1:
        return "vLLM's V1 runner design does not support it with pipeline parallelism"
    model_config = vllm_config.model_config
    if model_config is not None and model_config.runner_type == "pooling":
        return "pooling models sample nothing"
    return None


def _choose_kv_cache_manager(
    vllm_config: "VllmConfig", requested: engine_args.RequestedOptions
) -> None:
    from vllm_hpu.attention.windows import choose_kv_cache_manager

    choose_kv_cache_manager(vllm_config, requested.disable_hybrid_kv_cache_manager)
