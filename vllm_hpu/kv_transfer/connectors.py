"""Which KV connectors run on the HPU plugin, checked before any weight loads.

Run: ``NixlConnector`` (P/D disaggregation; NIXL reads host memory: the emulated
device's, or a host staging buffer on Gaudi) and KV offloading to host memory
(``--kv-offloading-size`` or ``OffloadingConnector``), routed to ``offloading.py``.
Every other (LMCache, P2P NCCL, Mooncake, MultiConnector, ...) is refused by name.
vLLM derives the transfer config from ``--kv-offloading-size`` after
``check_and_update_config`` on every pass, so the check also runs on the
finished config (``patches.py``, caller) and in the worker; once routed,
``kv_offloading_size`` is cleared so the engine core's pass derives nothing."""

import importlib.util
from typing import TYPE_CHECKING

from vllm.logger import init_logger

from vllm_hpu import device

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig, VllmConfig

logger = init_logger("vllm.hpu.kv_transfer")

NIXL_CONNECTORS = ("NixlConnector", "NixlPullConnector")
OFFLOADING_CONNECTOR = "OffloadingConnector"
HPU_OFFLOADING_MODULE = "vllm_hpu.kv_transfer.offloading"
HPU_OFFLOADING_CONNECTOR = "HpuOffloadingConnector"
HPU_OFFLOADING_SPEC = "HpuOffloadingSpec"
# The spec vLLM names by default; its scheduler side is ours too (a subclass).
VLLM_OFFLOADING_SPEC = "CPUOffloadingSpec"
NATIVE_OFFLOADING_BACKEND = "native"
HOST_BUFFER_DEVICE = "cpu"
SYNCHRONOUS_STEPS = "the HPU runner runs KV connectors in synchronous steps"


def has_kv_connector(vllm_config: "VllmConfig") -> bool:
    config = vllm_config.kv_transfer_config
    return config is not None and config.kv_connector is not None


def resolve_kv_transfer_config(vllm_config: "VllmConfig") -> None:
    """Refuse what we do not run; route offloading to the plugin (idempotent)."""
    if not has_kv_connector(vllm_config):
        return
    config = vllm_config.kv_transfer_config
    assert config is not None
    _reject_unsupported_setup(vllm_config)
    if config.kv_connector in NIXL_CONNECTORS and not config.kv_connector_module_path:
        _check_nixl(config)
    elif _is_offloading(config):
        _use_hpu_offloading(config)
        # Its size is the connector's now (cpu_bytes_to_use): left set, vLLM
        # would derive its own connector from it again on the engine core's
        # pass over this config, after the platform's hook.
        vllm_config.cache_config.kv_offloading_size = None
    else:
        raise ValueError(
            f"The HPU plugin does not run the KV connector {config.kv_connector!r} "
            "(from --kv-transfer-config or --kv-offloading-backend). It runs "
            f"{NIXL_CONNECTORS[0]} (prefill/decode disaggregation) and "
            "--kv-offloading-size (offload to host memory); start vLLM with one "
            "of those or without KV transfer."
        )


def check_offloading_backend(size: float | None, backend: str | None) -> None:
    """Before vLLM builds its config: only the native backend offloads here."""
    if size is not None and backend not in (None, NATIVE_OFFLOADING_BACKEND):
        raise ValueError(
            f"--kv-offloading-backend {backend}: the HPU plugin offloads KV to "
            f"host memory with the {NATIVE_OFFLOADING_BACKEND!r} backend only; "
            "leave the option out."
        )


def resolve_finished_config(vllm_config: "VllmConfig") -> None:
    """On vLLM's finished config, in the caller: the ``--kv-offloading-size``
    connector exists only now, and async scheduling is turned off for it."""
    resolve_kv_transfer_config(vllm_config)
    scheduler_config = vllm_config.scheduler_config
    if has_kv_connector(vllm_config) and scheduler_config.async_scheduling:
        logger.info("Async scheduling disabled: %s.", SYNCHRONOUS_STEPS)
        scheduler_config.async_scheduling = False


def check_worker_config(vllm_config: "VllmConfig") -> None:
    """In the worker: configs built without engine arguments skipped the others."""
    resolve_kv_transfer_config(vllm_config)
    if has_kv_connector(vllm_config) and vllm_config.scheduler_config.async_scheduling:
        raise ValueError(
            f"KV transfer needs synchronous steps: {SYNCHRONOUS_STEPS}. Start "
            "vLLM with --no-async-scheduling."
        )


def _reject_unsupported_setup(vllm_config: "VllmConfig") -> None:
    unsupported = {
        "pipeline parallelism": vllm_config.parallel_config.pipeline_parallel_size > 1,
        "speculative decoding": vllm_config.speculative_config is not None,
        "pooling models": vllm_config.model_config is not None
        and vllm_config.model_config.runner_type == "pooling",
    }
    for feature, present in unsupported.items():
        if present:
            raise ValueError(
                f"The HPU plugin does not combine KV transfer with {feature} yet; "
                "start vLLM without one of them."
            )


def _check_nixl(config: "KVTransferConfig") -> None:
    """NIXL importable, and the KV it reads in host memory."""
    if not any(importlib.util.find_spec(name) for name in ("nixl", "nixl_cu12")):
        raise ValueError(
            "NixlConnector needs NIXL: pip install nixl-cu12 (it needs no CUDA "
            "and bundles UCX; the 'nixl' meta package pulls both CUDA builds)."
        )
    if config.kv_buffer_device == device.device_type() and device.hpu_available():
        logger.info(
            "NixlConnector on Gaudi stages KV blocks through a host buffer "
            "(kv_buffer_device=%s).",
            HOST_BUFFER_DEVICE,
        )
        config.kv_buffer_device = HOST_BUFFER_DEVICE
    if config.kv_buffer_device != HOST_BUFFER_DEVICE:
        raise ValueError(
            f"kv_buffer_device={config.kv_buffer_device!r}: NIXL reads HPU KV "
            f"from host memory here; set kv_buffer_device to "
            f"{HOST_BUFFER_DEVICE!r} or leave it out."
        )


def _is_offloading(config: "KVTransferConfig") -> bool:
    if config.kv_connector == OFFLOADING_CONNECTOR:
        return not config.kv_connector_module_path
    return (
        config.kv_connector == HPU_OFFLOADING_CONNECTOR
        and config.kv_connector_module_path == HPU_OFFLOADING_MODULE
    )


def _use_hpu_offloading(config: "KVTransferConfig") -> None:
    """vLLM's offloading connector, with the plugin's worker side and spec."""
    extra = config.kv_connector_extra_config
    spec_name = extra.get("spec_name", VLLM_OFFLOADING_SPEC)
    if spec_name not in (VLLM_OFFLOADING_SPEC, HPU_OFFLOADING_SPEC):
        raise ValueError(
            f"The HPU plugin offloads KV to host memory only: offloading spec "
            f"{spec_name!r} is not supported; leave spec_name out."
        )
    if not extra.get("cpu_bytes_to_use"):
        raise ValueError(
            "KV offloading needs a host memory size: pass --kv-offloading-size "
            "(GiB) or cpu_bytes_to_use in kv_connector_extra_config."
        )
    config.kv_connector = HPU_OFFLOADING_CONNECTOR
    config.kv_connector_module_path = HPU_OFFLOADING_MODULE
    extra["spec_name"] = HPU_OFFLOADING_SPEC
    extra["spec_module_path"] = HPU_OFFLOADING_MODULE
