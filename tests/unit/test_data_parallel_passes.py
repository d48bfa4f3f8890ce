"""Data parallelism with MoE models (worker/capabilities/data_parallel.py): the
idle pass a rank without work runs, and the layouts refused at start-up."""

from types import SimpleNamespace

import pytest
import torch

from vllm_hpu.attention.metadata import CacheGeometry
from vllm_hpu.bucketing import BucketingConfig, HpuBucketManager, ServingLimits
from vllm_hpu.envs import read_envs
from vllm_hpu.worker.capabilities.data_parallel import (
    NO_TOKEN_IDS,
    unsupported_layouts,
)
from vllm_hpu.worker.passes.build import build_decode_pass

BLOCK_SIZE, NUM_BLOCKS = 16, 64
LIMITS = ServingLimits(
    max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256, block_size=16
)


def test_idle_pass_is_the_smallest_decode_writing_only_the_dummy_block():
    buckets = HpuBucketManager(BucketingConfig.from_limits(LIMITS, read_envs({})))
    buckets.set_num_kv_blocks(NUM_BLOCKS)
    cache = CacheGeometry(BLOCK_SIZE, NUM_BLOCKS, torch.float32, torch.device("cpu"))
    idle = build_decode_pass([], buckets, NO_TOKEN_IDS, cache)
    assert not idle.is_prompt and idle.seqs == []
    assert idle.bucket == buckets.find_decode_bucket(1, 1)
    slots = idle.attn_metadata.slot_mapping
    assert slots.numel() == idle.num_tokens == idle.bucket.batch_size
    assert bool((slots // BLOCK_SIZE == NUM_BLOCKS).all())  # the dummy block


def parallel_config(**changes) -> SimpleNamespace:
    values = {
        "data_parallel_size": 2,
        "pipeline_parallel_size": 1,
        "enable_expert_parallel": False,
        "all2all_backend": "allgather_reducescatter",
    }
    return SimpleNamespace(**(values | changes))


@pytest.mark.parametrize(
    ("changes", "is_moe", "named"),
    [
        ({"pipeline_parallel_size": 2}, True, "pipeline parallelism"),
        ({"all2all_backend": "deepep_low_latency"}, True, "'deepep_low_latency'"),
        ({"all2all_backend": "deepep_low_latency"}, False, None),  # no exchange
        ({"moe_backend": "triton"}, True, "'triton' MoE backend"),
        ({"moe_backend": "triton"}, False, None),
        ({}, True, None),
        ({"pipeline_parallel_size": 2}, False, None),  # dense ranks: independent
    ],
)
def test_unsupported_expert_layouts_are_named(changes, is_moe, named):
    config = SimpleNamespace(
        parallel_config=parallel_config(**changes),
        model_config=SimpleNamespace(is_moe=is_moe),
        kernel_config=SimpleNamespace(moe_backend=changes.get("moe_backend", "auto")),
    )
    refused = [name for name, on in unsupported_layouts(config).items() if on]
    assert len(refused) == (named is not None)
    assert named is None or named in refused[0]
