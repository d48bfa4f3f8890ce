"""Ray for HPU engines: the emulated cards declared, too few cards named at once
(vLLM alone starts Ray declaring none, then waits 30 minutes for ``HPU`` bundles)."""

from typing import TYPE_CHECKING, Any

import ray
from vllm.logger import init_logger
from vllm.v1.executor.ray_executor_v2 import RayExecutorV2

from vllm_hpu import device

if TYPE_CHECKING:
    from vllm.config import ParallelConfig
    from vllm.v1.executor.abstract import Executor

logger = init_logger("vllm.hpu.ray")

RESOURCE = "HPU"


def init_ray_with_hpus(parallel_config: "ParallelConfig") -> bool:
    """Connect to a Ray cluster or start one; fail unless it has enough HPUs.
    True when this process initialised Ray (and must shut it down)."""
    initialised = not ray.is_initialized()
    if initialised:
        _connect_or_start(parallel_config)
    try:
        check_hpu_resources(ray.cluster_resources(), parallel_config.world_size)
    except RuntimeError:
        if initialised:  # no engine will shut it down
            ray.shutdown()
        raise
    return initialised


def _connect_or_start(parallel_config: "ParallelConfig") -> None:
    """As vLLM would (RAY_ADDRESS, a `ray start` cluster here, else a new one declaring
    the emulated HPUs); not ``address="auto"``, which joins any local cluster."""
    runtime_env = parallel_config.ray_runtime_env
    resources = device.emulated_ray_resources(parallel_config.world_size)
    if resources is not None:
        try:
            ray.init(runtime_env=runtime_env, resources=resources)
            logger.info("Started a Ray cluster on this node with %s", resources)
            return
        except ValueError:
            # A running cluster takes no resources from drivers: it declares its own.
            pass
    ray.init(runtime_env=runtime_env)


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


def _placement_group_given(parallel_config: "ParallelConfig") -> bool:
    """Whether the caller handed vLLM a placement group (the config's, or the one
    this process runs in); otherwise vLLM creates one for the engine."""
    return (
        parallel_config.placement_group is not None
        or ray.util.get_current_placement_group() is not None
    )


class _HpuRay:
    """Runs the checks above before vLLM's Ray start-up; at shutdown removes vLLM's
    placement group (it would hold the HPUs 30 minutes) and Ray if we started it."""

    parallel_config: "ParallelConfig"
    owns_ray = False
    owns_placement_group = False

    def _init_executor(self) -> None:
        self.owns_ray = init_ray_with_hpus(self.parallel_config)
        self.owns_placement_group = not _placement_group_given(self.parallel_config)
        super()._init_executor()  # type: ignore[misc]

    def shutdown(self) -> None:
        super().shutdown()  # type: ignore[misc]
        placement_group = self.parallel_config.placement_group
        if self.owns_placement_group and placement_group is not None:
            self.owns_placement_group = False
            ray.util.remove_placement_group(placement_group)
            self.parallel_config.placement_group = None
        if self.owns_ray:
            self.owns_ray = False
            logger.info("Shutting down the Ray this engine initialised")
            ray.shutdown()


class HpuRayExecutorV2(_HpuRay, RayExecutorV2):
    pass


def hpu_ray_executor() -> type["Executor"]:
    """The executor vLLM picks for ``ray`` (the V2 one), preceded by the checks
    above; vLLM 0.32's older Ray executor is refused at start-up."""
    return HpuRayExecutorV2
