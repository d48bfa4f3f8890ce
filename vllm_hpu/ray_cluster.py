"""Ray for HPU engines: the emulated cards declared, missing cards named at once.

vLLM's Ray executors start Ray without declaring resources, then wait up to 30
minutes for a placement group of ``{"HPU": 1}`` bundles. Ray counts Gaudi cards by
itself but finds none in emulation, so these executors first connect to a running
cluster or start one (declaring the emulated HPUs), and check its HPU count.
"""

from typing import TYPE_CHECKING, Any

import ray
from vllm import envs as vllm_envs
from vllm.logger import init_logger
from vllm.v1.executor.ray_executor import RayDistributedExecutor
from vllm.v1.executor.ray_executor_v2 import RayExecutorV2

from vllm_hpu import device

if TYPE_CHECKING:
    from vllm.config import ParallelConfig
    from vllm.v1.executor.abstract import Executor

logger = init_logger("vllm.hpu.ray")

RESOURCE = "HPU"


def init_ray_with_hpus(parallel_config: "ParallelConfig") -> bool:
    """Connect to a Ray cluster or start one; fail unless it has enough HPUs.
    True when this process started the cluster (and must stop it)."""
    started = False
    if not ray.is_initialized():
        started = _connect_or_start(parallel_config)
    check_hpu_resources(ray.cluster_resources(), parallel_config.world_size)
    return started


def _connect_or_start(parallel_config: "ParallelConfig") -> bool:
    runtime_env = parallel_config.ray_runtime_env
    try:
        # RAY_ADDRESS, or the cluster `ray start` left on this node.
        ray.init(address="auto", runtime_env=runtime_env)
        return False
    except ConnectionError:
        pass
    resources = device.emulated_ray_resources(parallel_config.world_size)
    logger.info("Starting a Ray cluster on this node with resources %s", resources)
    ray.init(runtime_env=runtime_env, resources=resources)
    return True


def check_hpu_resources(cluster_resources: dict[str, Any], num_needed: int) -> None:
    """Raise, saying how to declare cards, when the cluster has fewer than needed."""
    found = cluster_resources.get(RESOURCE, 0)
    if found >= num_needed:
        return
    raise RuntimeError(
        f"The Ray cluster offers {found:g} {RESOURCE} resource(s); this engine "
        f"needs {num_needed} (tensor x pipeline parallel size). Ray counts the Gaudi "
        "cards of each node itself (check `ray status`); in CPU emulation declare "
        f"the emulated cards when starting the cluster: ray start --head "
        f"--resources='{{\"{RESOURCE}\": {num_needed}}}', or "
        f'ray.init(resources={{"{RESOURCE}": {num_needed}}}).'
    )


class _HpuRay:
    """Before vLLM's Ray start-up: the checks above; at shutdown, the cluster
    this engine started is stopped with it (its processes would outlive it)."""

    parallel_config: "ParallelConfig"
    started_ray = False

    def _init_executor(self) -> None:
        self.started_ray = init_ray_with_hpus(self.parallel_config)
        super()._init_executor()  # type: ignore[misc]

    def shutdown(self) -> None:
        super().shutdown()  # type: ignore[misc]
        if self.started_ray:
            self.started_ray = False
            logger.info("Stopping the Ray cluster this engine started")
            ray.shutdown()


class HpuRayExecutorV2(_HpuRay, RayExecutorV2):
    pass


class HpuRayDistributedExecutor(_HpuRay, RayDistributedExecutor):
    pass


def hpu_ray_executor() -> type["Executor"]:
    """The executor vLLM would pick for ``ray``, preceded by the checks above."""
    if vllm_envs.VLLM_USE_RAY_V2_EXECUTOR_BACKEND:
        return HpuRayExecutorV2
    return HpuRayDistributedExecutor
