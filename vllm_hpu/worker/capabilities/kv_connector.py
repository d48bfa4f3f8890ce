"""The worker's and runner's side of vLLM's KV connector contract, in vLLM's GPU
order, through vLLM's own mixin where it has one. The worker creates the
connector before the caches, reports its handshake metadata and shuts it down.
The runner (:class:`KVConnectorSteps`) registers block-major cache views
(``kv_transfer/layout.py``), handles preempted requests in ``before_update``,
binds connector metadata around the passes in ``step``, and answers a step with
no tokens with ``no_forward_output``. Warmup's synthetic steps bypass it all."""

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
from vllm.v1.outputs import (
    EMPTY_MODEL_RUNNER_OUTPUT,
    KVConnectorOutput,
    ModelRunnerOutput,
)
from vllm.v1.worker.kv_connector_model_runner_mixin import (
    KVConnectorModelRunnerMixin,
)

from vllm_hpu.kv_transfer.layout import block_major_view, connector_kv_cache_config


def initialize_kv_transfer(
    vllm_config: VllmConfig, kv_cache_config: KVCacheConfig
) -> None:
    """Create this worker's connector, if the config names one."""
    ensure_kv_transfer_initialized(
        vllm_config, connector_kv_cache_config(kv_cache_config)
    )


def kv_connector_handshake_metadata() -> (
    dict[tuple[int, int], KVConnectorHandshakeMetadata] | None
):
    """This worker's handshake metadata keyed by (pp_rank, tp_rank), or None."""
    if not has_kv_transfer_group():
        return None
    metadata = get_kv_transfer_group().get_handshake_metadata()
    if metadata is None:
        return None
    ranks = (get_pp_group().rank_in_group, get_tp_group().rank_in_group)
    return {ranks: metadata}


def shutdown_kv_transfer() -> None:
    ensure_kv_transfer_shutdown()


class KVConnectorSteps:
    """The runner's calls into the connector; without one each does nothing."""

    def __init__(self, vllm_config: VllmConfig):
        self.vllm_config = vllm_config
        self.output: KVConnectorOutput | None = None

    def register_kv_caches(self, kv_caches: Mapping[str, Any], block_size: int) -> None:
        if not has_kv_transfer_group():
            return
        connector = get_kv_transfer_group()
        connector.register_kv_caches(
            {name: block_major_view(c, block_size) for name, c in kv_caches.items()}
        )
        connector.set_host_xfer_buffer_ops(copy_kv_blocks)

    def before_update(self, scheduler_output: SchedulerOutput) -> None:
        metadata = scheduler_output.kv_connector_metadata
        if metadata is not None:
            get_kv_transfer_group().handle_preemptions(metadata)

    @contextlib.contextmanager
    def step(self, scheduler_output: SchedulerOutput) -> Iterator[None]:
        """Around a step's passes; its output is kept for ``take_output``."""
        if scheduler_output.kv_connector_metadata is None:  # warmup
            yield
            return
        with (
            set_forward_context(None, self.vllm_config),
            KVConnectorModelRunnerMixin.maybe_get_kv_connector_output(
                scheduler_output
            ) as output,
        ):
            yield
        self.output = output

    def take_output(self) -> KVConnectorOutput | None:
        output, self.output = self.output, None
        return output

    def no_forward_output(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """A step with no tokens: the connector's cycle alone."""
        if scheduler_output.kv_connector_metadata is None:
            return EMPTY_MODEL_RUNNER_OUTPUT
        return KVConnectorModelRunnerMixin.kv_connector_no_forward(
            scheduler_output, self.vllm_config
        )
