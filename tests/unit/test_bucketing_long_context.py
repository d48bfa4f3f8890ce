"""Long-context bucket plans: square-root ladders for cached context and decode
blocks once max_model_len reaches 32k, context doubling from one block below
them; a bounded graph count at 32k, 128k and 1M; no decode bucket above what
the KV cache holds; long steps and short contexts padded little.
The padding of whole traces is measured by benchmarks/long_context.py."""

import pytest

from vllm_hpu.bucketing import BucketingConfig, HpuBucketManager, ServingLimits
from vllm_hpu.bucketing.buckets import Bucket
from vllm_hpu.bucketing.compact import compact_decode_buckets
from vllm_hpu.bucketing.long_context import (
    LONG_CONTEXT,
    LONG_CONTEXT_LEN,
    context_ladder,
    square_root_ladder,
)
from vllm_hpu.bucketing.merged_buckets import merged_prompt_buckets
from vllm_hpu.envs import read_envs

BLOCK = 128
# (max_model_len, max_num_seqs, KV blocks): the benchmark's configurations.
PLANS = [(32768, 32, 4096), (131072, 16, 4096), (1048576, 4, 16384)]
# The reference's sets: 196, 224, 228 graphs; ours 142, 138, 142 (139, 131,
# 129 before the doubling foot of the context ladder).
GRAPH_LIMIT = 145


def _manager(max_model_len: int, max_num_seqs: int, kv_blocks: int) -> HpuBucketManager:
    limits = ServingLimits(max_num_seqs, 8192, max_model_len, BLOCK, True)
    manager = HpuBucketManager(BucketingConfig.from_limits(limits, read_envs({})))
    manager.set_num_kv_blocks(kv_blocks)
    return manager


def test_square_root_ladder_is_dense_near_the_top() -> None:
    values = square_root_ladder(0, 1000, 8)
    assert values == [16, 63, 141, 250, 391, 563, 766, 1000]
    gaps = [b - a for a, b in zip([0, *values], values, strict=False)]
    assert gaps == sorted(gaps)  # the gaps widen towards the top
    assert square_root_ladder(4, 4, 8) == [4]


@pytest.mark.parametrize(("max_model_len", "max_num_seqs", "kv_blocks"), PLANS)
def test_long_context_plan_is_bounded_and_within_the_kv_cache(
    max_model_len: int, max_num_seqs: int, kv_blocks: int
) -> None:
    manager = _manager(max_model_len, max_num_seqs, kv_blocks)
    graphs = len(manager.prompt_buckets) + len(manager.decode_buckets)
    assert graphs <= GRAPH_LIMIT
    assert max(b.num_blocks for b in manager.decode_buckets) <= kv_blocks
    for bucket in manager.decode_buckets:
        assert bucket.num_blocks <= bucket.batch_size * max_model_len // BLOCK
    most_context = -(-(max_model_len - 1) // BLOCK)
    contexts = {b.num_blocks for b in manager.prompt_buckets}
    foot, upper = context_ladder(most_context, LONG_CONTEXT.num_context_values)
    assert contexts == {0, *foot, *upper} and max(contexts) == most_context


def test_context_ladder_doubles_up_to_the_square_root_ladders_second_value():
    """At 256 blocks (32k) the square-root ladder's 4 gives way to 1, 2, 4, 8
    (its 16 is the second value, where its steps no longer outgrow the values
    they start from); the foot grows with the context: 9 values at 8192."""
    assert context_ladder(256, 8) == ([1, 2, 4, 8], [16, 36, 64, 100, 144, 196, 256])
    foot, upper = context_ladder(8192, 8)
    assert foot == [2**i for i in range(9)] and upper[0] == 512
    assert square_root_ladder(0, 8192, 8)[1:] == upper


@pytest.mark.parametrize(("max_model_len", "max_num_seqs", "kv_blocks"), PLANS)
def test_short_contexts_of_a_full_pass_pad_less_than_double(
    max_model_len: int, max_num_seqs: int, kv_blocks: int
) -> None:
    """A prefix hit of a few blocks, or a prompt's chunk after a short first
    one, in a pass that fills the step: its context pads to less than twice
    its blocks up to the square-root ladder (1 block took 4 at 32k, 128 at 1M)."""
    manager = _manager(max_model_len, max_num_seqs, kv_blocks)
    most_context = -(-(max_model_len - 1) // BLOCK)
    _, upper = context_ladder(most_context, LONG_CONTEXT.num_context_values)
    for context in range(1, upper[0] + 1):
        bucket = manager.find_prompt_bucket(1, 8192, context)
        assert bucket.query_len == 8192
        assert bucket.num_blocks < 2 * context


@pytest.mark.parametrize(("max_model_len", "max_num_seqs", "kv_blocks"), PLANS)
def test_long_context_steps_pad_little(
    max_model_len: int, max_num_seqs: int, kv_blocks: int
) -> None:
    """A chunk a third of the way into the longest prompt, and a batch of long
    sequences: the compact set pads the chunk's context to the most a request
    can hold; the long ladders pad both by under 35 %, the batch in its own
    batch size's bucket."""
    manager = _manager(max_model_len, max_num_seqs, kv_blocks)
    most_context = -(-(max_model_len - 1) // BLOCK)
    context = most_context // 3
    prompt = manager.find_prompt_bucket(1, 8192, context)
    assert prompt.num_blocks <= 1.35 * context
    before = [b for b in merged_prompt_buckets(manager.config) if b.num_blocks]
    assert {b.num_blocks for b in before} == {most_context}
    seqs = min(max_num_seqs, 4)
    blocks = min(kv_blocks, seqs * most_context) // 3
    decode = manager.find_decode_bucket(seqs, blocks)
    assert decode.num_blocks <= 1.35 * blocks
    assert decode.batch_size == seqs


def test_short_contexts_keep_the_compact_set() -> None:
    """Below 32k the compact set as it is; from 32k on its buckets of up to 4
    blocks per sequence stay, the long ladders take over above."""
    manager = _manager(LONG_CONTEXT_LEN // 2, 32, 4096)
    assert manager.prompt_buckets == merged_prompt_buckets(manager.config)
    assert manager.decode_buckets == compact_decode_buckets(manager.config, 4096)
    long = _manager(LONG_CONTEXT_LEN, 32, 4096)
    short = {
        bucket
        for bucket in compact_decode_buckets(long.config, 4096)
        if bucket.num_blocks <= 4 * bucket.batch_size
    }
    assert short <= set(long.decode_buckets)
    assert Bucket(1, 8192, 0) in long.prompt_buckets
