"""Data parallelism with a MoE model: MoE layers exchange tokens among the ranks,
so each rank runs as many passes as the busiest one, adding idle padded decode
passes (writing to the dummy block). Dense models run as independent engines."""

from dataclasses import replace

import numpy as np
import torch
import torch.distributed as dist
from vllm.config import VllmConfig
from vllm.distributed import get_dp_group

from vllm_hpu.attention.metadata import CacheGeometry
from vllm_hpu.bucketing import HpuBucketManager
from vllm_hpu.worker.passes.build import build_decode_pass
from vllm_hpu.worker.passes.forward_pass import ForwardPass

# The all2all backend the plugin's token exchange is (vLLM's default).
ALL2ALL_BACKEND = "allgather_reducescatter"
# An idle pass reads no request's tokens.
NO_TOKEN_IDS = np.zeros((1, 1), dtype=np.int64)


def exchanges_tokens(vllm_config: VllmConfig) -> bool:
    """Whether the MoE layers exchange tokens among data-parallel ranks."""
    parallel_config = vllm_config.parallel_config
    return parallel_config.data_parallel_size > 1 and vllm_config.model_config.is_moe


def unsupported_layouts(vllm_config: VllmConfig) -> dict[str, bool]:
    """Layouts of experts over ranks and MoE options that ops/fused_moe.py and
    the passes here do not run, refused at start-up (refusals.py) by name."""
    parallel = vllm_config.parallel_config
    model_config = vllm_config.model_config
    moe_backend = vllm_config.kernel_config.moe_backend
    is_moe = model_config is not None and model_config.is_moe
    moe_dp = is_moe and parallel.data_parallel_size > 1
    exchanges = moe_dp or (is_moe and parallel.enable_expert_parallel)
    backend = parallel.all2all_backend
    return {
        "pipeline parallelism with data parallelism for MoE models": bool(
            moe_dp and parallel.pipeline_parallel_size > 1
        ),
        # The plugin's exchange is vLLM's default (distributed/communicator.py).
        f"the '{backend}' all2all backend (kernels of CUDA, ROCm or NIXL; MoE "
        "tokens travel by all-gather and all-reduce, vLLM's "
        f"'{ALL2ALL_BACKEND}': leave --all2all-backend unset)": bool(
            exchanges and backend != ALL2ALL_BACKEND
        ),
        # vLLM's GPU expert kernels; the plugin's method runs the experts itself.
        f"the '{moe_backend}' MoE backend (vLLM's GPU kernels; the plugin runs "
        "the experts itself, Gaudi's fused MoE kernel on Gaudi: leave "
        "--moe-backend unset)": is_moe and moe_backend != "auto",
    }


class PassAlignment:
    """A rank's passes as planned: no other rank waits for them (this class),
    unless MoE layers exchange tokens among data-parallel ranks."""

    def align(
        self, passes: list[ForwardPass], cache: CacheGeometry
    ) -> list[ForwardPass]:
        return passes


class DataParallelPasses(PassAlignment):
    def __init__(self, buckets: HpuBucketManager, dp_rank: int, dp_size: int) -> None:
        self.buckets = buckets
        self.dp_rank = dp_rank
        self.dp_size = dp_size

    def align(
        self, passes: list[ForwardPass], cache: CacheGeometry
    ) -> list[ForwardPass]:
        """The step's passes, then idle ones up to the busiest rank's, with every rank's
        token counts; the all-reduces run here, off the device stream."""
        group = get_dp_group().cpu_group
        count = torch.tensor([len(passes)], dtype=torch.int64)
        dist.all_reduce(count, op=dist.ReduceOp.MAX, group=group)
        num_passes = int(count.item())
        if num_passes == 0:  # every rank idle: no exchange to join
            return []
        if num_passes > len(passes):
            idle = build_decode_pass([], self.buckets, NO_TOKEN_IDS, cache)
            passes = passes + [idle] * (num_passes - len(passes))
        num_tokens = torch.zeros((num_passes, self.dp_size), dtype=torch.int32)
        num_tokens[:, self.dp_rank] = torch.tensor([p.num_tokens for p in passes])
        dist.all_reduce(num_tokens, group=group)
        return [
            replace(p, num_tokens_across_dp=across_dp)
            for p, across_dp in zip(passes, num_tokens, strict=True)
        ]
