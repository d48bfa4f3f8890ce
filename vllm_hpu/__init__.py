"""vllm-hpu: the Intel Gaudi (HPU) platform plugin for vLLM.

vLLM calls :func:`register` in every process to learn whether this platform is
active, and :func:`register_ops` to load our custom ops and attention backend.
Both are cheap and idempotent; nothing here imports vLLM at module level.
"""

import functools

PLATFORM_CLS = "vllm_hpu.platform.HpuPlatform"


def register() -> str | None:
    """The platform's dotted class path when Gaudi or emulation is there, else None.

    Either way it lets vLLM take ``--device hpu`` / ``device="hpu"`` and check it,
    since vLLM calls this as it is imported, before it builds any ``EngineArgs``.
    """
    from vllm_hpu import device, envs
    from vllm_hpu.patches import (
        engine_args,
        engine_failures,
        engine_shutdown,
        log_records,
        nixl,
        torchvision_import,
    )

    engine_args.accept_device_option()
    torchvision_import.allow_torchvision_import()
    nixl.import_nixl_from_wheel()
    if device.hpu_available() or device.is_emulation():
        # CUDA's breakable graphs never run here; left unset, vLLM writes
        # VLLM_USE_BREAKABLE_CUDAGRAPH=1 into the process's environment for
        # DeepSeek-V3.2 and kin, forcing compilation mode NONE on every later
        # config of the process (an RL loop, a test worker).
        envs.set_default("VLLM_USE_BREAKABLE_CUDAGRAPH", "0")
        log_records.drop_harmless_log_records()
        engine_failures.report_engine_failures()
        engine_shutdown.give_engines_time_to_exit()
        return PLATFORM_CLS
    _say_why_inactive()
    return None


@functools.cache
def _say_why_inactive() -> None:
    """Once per process: without this line a newcomer on a machine with no Gaudi
    meets only vLLM's "Device string must not be empty" (no platform found)."""
    from vllm.logger import init_logger

    init_logger("vllm.hpu").warning(
        "The HPU platform is off in this process: the Habana bridge reports no "
        "Gaudi and VLLM_HPU_EMULATION is not 1. To run on the CPU in emulation, "
        "set VLLM_HPU_EMULATION=1."
    )


def register_ops() -> None:
    """Register custom-op overrides and the attention backend (idempotent)."""
    from vllm_hpu.patches import (
        accelerator,
        engine_args,
        fp8_kernels,
        logprobs,
        lora_moe,
        moe_config,
    )

    engine_args.accept_device_option()
    if register() is None:
        return

    accelerator.apply_accelerator_patches()
    logprobs.count_ranks_eagerly()
    import vllm_hpu.attention.backend
    import vllm_hpu.ops.custom_ops  # registers the op overrides
    import vllm_hpu.ops.fused_moe  # noqa: F401  registers the MoE method
    from vllm_hpu.attention.sparse_mla import register_sparse_mla
    from vllm_hpu.distributed import weight_transfer
    from vllm_hpu.quantization import (
        awq,
        fp8,
        gptq,
        inc_config,
        int8,
        moe_configs,
        mxfp4,
        wna16,
    )

    register_sparse_mla()
    awq.register()
    gptq.register()
    for kernels in (fp8, int8, wna16, mxfp4):
        kernels.register()
    fp8_kernels.register_block_fp8_kernel()
    fp8_kernels.keep_fp8_shard_scales()
    fp8_kernels.quantize_within_card_range()
    moe_config.accept_non_gated_experts()
    lora_moe.keep_moe_layers_without_lora()
    moe_configs.register()
    inc_config.register()
    weight_transfer.register()  # the "hpu" weight transfer backend
