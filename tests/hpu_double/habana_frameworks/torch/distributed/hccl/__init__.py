"""The "hccl" process-group backend (bridge v1.19.0 distributed/hccl/__init__.py).

Importing it sets HLS_MODULE_ID from the launcher's LOCAL_RANK as the bridge
does (``initialize_distributed_hpu``), registers "hccl" with torch.distributed,
and keeps collectives out of dynamo graphs.

The emulated HCCL is gloo on the HPU tensors' host memory: a collective on HPU
tensors reaches the device's fallback, which runs torch's CPU collective kernel
on host views of the tensors, so the "hccl" group carries a gloo backend for the
CPU device type beside the HPU one. In lazy mode without
PT_HPU_ENABLE_LAZY_COLLECTIVES a collective first runs the pending graph, and
refuses to run inside an HPU-graph capture (ProcessGroupHCCL.cpp:461-472).
"""

import inspect
import os
import warnings
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from habana_frameworks.torch.hpu._utils import (
    HABANA_VISIBLE_MODULES_VAR,
    HLS_MODULE_ID_VAR,
)


def _setup_module_id(local_rank: int = -1, world_size: int = 1) -> None:
    if HLS_MODULE_ID_VAR in os.environ or local_rank == -1 or world_size == 1:
        return
    if HABANA_VISIBLE_MODULES_VAR in os.environ:
        visible = os.environ[HABANA_VISIBLE_MODULES_VAR].split(",")
        assert local_rank < len(visible), (
            f"There is not enough devices available for training. Please verify if "
            f"{HABANA_VISIBLE_MODULES_VAR} is set correctly."
        )
        os.environ[HLS_MODULE_ID_VAR] = visible[local_rank]
        return
    os.environ[HLS_MODULE_ID_VAR] = str(local_rank)


def initialize_distributed_hpu(
    world_size: int | None = None,
    rank: int | None = None,
    local_rank: int | None = None,
) -> tuple[int, int, int]:
    """World size, rank and local rank from the launcher's environment; sets
    HLS_MODULE_ID to the local rank's card."""
    if world_size is not None and rank is not None and local_rank is not None:
        os.environ["WORLD_SIZE"] = str(world_size)
        os.environ["RANK"] = str(rank)
        os.environ["LOCAL_RANK"] = str(local_rank)
    world_size = int(os.getenv("WORLD_SIZE", "1"))
    rank = int(os.getenv("RANK", "-1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "-1"))
    _setup_module_id(local_rank=local_rank, world_size=world_size)
    if rank != -1:
        os.environ["ID"] = str(rank)
    return world_size, rank, local_rank


def _create_process_group_hccl(backend_opts: Any, pg_opts: Any) -> Any:
    timeout = getattr(backend_opts, "timeout", timedelta(minutes=30))
    return dist.ProcessGroupGloo(
        backend_opts.store, backend_opts.group_rank, backend_opts.group_size, timeout
    )


def _disallow_collectives_in_graph() -> None:
    """As the bridge (hccl/__init__.py:121-160): dynamo graph-breaks at
    torch.distributed's collectives."""
    names = (
        "all_gather", "all_reduce", "all_to_all", "barrier", "broadcast", "gather",
        "irecv", "isend", "recv", "reduce", "scatter", "send",
    )  # fmt: skip
    with warnings.catch_warnings():  # dist.reduce_op warns when looked at
        warnings.simplefilter("ignore", FutureWarning)
        members = [getattr(dist, member) for member in dir(dist)]
        functions = [member for member in members if inspect.isfunction(member)]
    for function in functions:
        if any(name in function.__name__ for name in names):
            torch._dynamo.decorators._disallow_in_graph_helper(False)(function)


initialize_distributed_hpu()
dist.Backend.register_backend(
    "hccl", _create_process_group_hccl, extended_api=True, devices=["hpu", "cpu"]
)
_disallow_collectives_in_graph()
