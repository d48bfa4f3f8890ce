"""The worker's and runner's side of vLLM's KV connector contract.

What vLLM's GPU worker and runner do (``gpu_worker.py``, ``gpu_model_runner.py``,
``kv_connector_model_runner_mixin.py``), in the same order, through vLLM's own
mixin where it has one:
- ``initialize`` the transfer group with the KV cache config (before the caches
  exist), ``register_kv_caches`` once they do, as block-major views
  (``layout.py``), with the platform's host-buffer copies for NIXL on Gaudi;
- ``handshake_metadata`` for the engine to hand the scheduler side;
- per step: ``handle_preemptions`` before the batch changes, then the passes
  inside ``transfer_step`` (binds the step's connector metadata, starts loads,
  waits for saves, collects finished sends/receives, failed loads and stats
  into the step's ``KVConnectorOutput``); a step with no tokens still runs the
  cycle (``no_forward_output``: requests waiting on remote KV, pending sends);
- ``shutdown``.
Warmup's synthetic steps carry no connector metadata and bypass all of it.
"""

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from vllm.config import VllmConfig
from vllm.distributed.kv_transfer import (
    ensure_kv_transfer_initialized,
    ensure_kv_transfer_shutdown,
    get_kv_transfer_group,
    has_kv_transfer_group,
)
from vllm.distributed.kv_transfer.kv_connector.utils import copy_kv_blocks
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorHandshakeMetadata,
)
from vllm.distributed.parallel_state import get_pp_group, get_tp_group
from vllm.forward_context import set_forward_context
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.worker.kv_connector_model_runner_mixin import (
    KVConnectorModelRunnerMixin,
)

from vllm_hpu.kv_transfer.layout import block_major_view, connector_kv_cache_config


def initialize(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> None:
    """Create this worker's connector, if the config names one."""
    ensure_kv_transfer_initialized(
        vllm_config, connector_kv_cache_config(kv_cache_config)
    )


def register_kv_caches(kv_caches: Mapping[str, Any], block_size: int) -> None:
    """Hand the connector each layer's cache, block-major."""
    if not has_kv_transfer_group():
        return
    connector = get_kv_transfer_group()
    connector.register_kv_caches(
        {name: block_major_view(cache, block_size) for name, cache in kv_caches.items()}
    )
    connector.set_host_xfer_buffer_ops(copy_kv_blocks)


def handshake_metadata() -> dict[tuple[int, int], KVConnectorHandshakeMetadata] | None:
    """This worker's handshake metadata keyed by (pp_rank, tp_rank), or None."""
    if not has_kv_transfer_group():
        return None
    metadata = get_kv_transfer_group().get_handshake_metadata()
    if metadata is None:
        return None
    return {(get_pp_group().rank_in_group, get_tp_group().rank_in_group): metadata}


def is_transfer_step(scheduler_output: SchedulerOutput) -> bool:
    """A real step of an engine with a connector (warmup's carry no metadata)."""
    return (
        has_kv_transfer_group() and scheduler_output.kv_connector_metadata is not None
    )


def handle_preemptions(scheduler_output: SchedulerOutput) -> None:
    """Let the connector act before preempted requests' blocks are reused."""
    if is_transfer_step(scheduler_output):
        metadata = scheduler_output.kv_connector_metadata
        assert metadata is not None
        get_kv_transfer_group().handle_preemptions(metadata)


@contextlib.contextmanager
def transfer_step(
    scheduler_output: SchedulerOutput, vllm_config: VllmConfig
) -> Iterator[KVConnectorOutput | None]:
    """Around a step's passes: yields the step's connector output (filled on
    exit), or None without a connector."""
    if not is_transfer_step(scheduler_output):
        yield None
        return
    with (
        set_forward_context(None, vllm_config),
        KVConnectorModelRunnerMixin.maybe_get_kv_connector_output(
            scheduler_output
        ) as output,
    ):
        yield output


def no_forward_output(
    scheduler_output: SchedulerOutput, vllm_config: VllmConfig
) -> ModelRunnerOutput | None:
    """The output of a step with no tokens: the connector's cycle alone, or
    None when there is nothing to report (no connector)."""
    if not is_transfer_step(scheduler_output):
        return None
    return KVConnectorModelRunnerMixin.kv_connector_no_forward(
        scheduler_output, vllm_config
    )


def shutdown() -> None:
    ensure_kv_transfer_shutdown()
