"""VLLM_HPU_EXACT_SHAPES: lookups return the exact shape, with no padding or misses."""

import logging

import pytest

from vllm_hpu.bucketing import Bucket, BucketingConfig, HpuBucketManager, ServingLimits
from vllm_hpu.envs import read_envs

LIMITS = ServingLimits(
    max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=4096, block_size=128
)


def make_manager(exact_shapes: bool) -> HpuBucketManager:
    manager = HpuBucketManager(
        BucketingConfig.from_limits(LIMITS, read_envs({})), exact_shapes=exact_shapes
    )
    manager.set_num_kv_blocks(2048)
    return manager


def test_exact_shapes_variable_parses():
    assert read_envs({}).exact_shapes is False
    assert read_envs({"VLLM_HPU_EXACT_SHAPES": "1"}).exact_shapes is True


@pytest.mark.parametrize(
    ("batch_size", "query_len", "num_context_blocks"),
    [(1, 17, 0), (3, 412, 0), (5, 1000, 2), (64, 2048, 0)],
)
def test_exact_prompt_lookup_returns_the_shape(
    batch_size, query_len, num_context_blocks
):
    bucketed = make_manager(exact_shapes=False).find_prompt_bucket(
        batch_size, query_len, num_context_blocks
    )
    exact = make_manager(exact_shapes=True).find_prompt_bucket(
        batch_size, query_len, num_context_blocks
    )
    assert exact == Bucket(batch_size, query_len, num_context_blocks)
    assert bucketed.query_len >= exact.query_len


@pytest.mark.parametrize(("batch_size", "num_blocks"), [(1, 1), (3, 7), (63, 500)])
def test_exact_decode_lookup_returns_the_shape(batch_size, num_blocks):
    manager = make_manager(exact_shapes=True)
    bucket = manager.find_decode_bucket(batch_size, num_blocks)
    assert bucket == Bucket(batch_size, 1, num_blocks)
    manager.stats.record_decode(bucket, batch_size, num_blocks)
    assert manager.stats.decode_batch.ratio == 0.0
    assert manager.stats.decode_blocks.ratio == 0.0


def test_exact_shapes_beyond_every_bucket_do_not_warn(vllm_log):
    manager = make_manager(exact_shapes=True)
    bucket = manager.find_prompt_bucket(1, 9000, 0)
    assert bucket == Bucket(1, 9000, 0)
    assert not vllm_log.messages(logging.WARNING)
    assert Bucket(1, 9000, 0) not in manager.prompt_buckets
