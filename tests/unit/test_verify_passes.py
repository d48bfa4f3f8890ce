"""Verification passes (speculative decoding): rows with drafts plan as decode
rows, padded to a verification bucket (bs x k+1 queries x blocks) that sits
beside each decode bucket, rows' tokens packed into groups of ``Q`` slots."""

import dataclasses

import numpy as np
import torch

from vllm_hpu.attention.metadata import CacheGeometry, SeqLayout
from vllm_hpu.bucketing import Bucket, BucketingConfig, HpuBucketManager, ServingLimits
from vllm_hpu.bucketing.manager import verification_buckets
from vllm_hpu.envs import read_envs
from vllm_hpu.worker.passes.build import build_decode_pass
from vllm_hpu.worker.passes.seqs import ScheduledSeq, split_by_phase

BLOCK = 16
QUERIES = 4  # k = 3
NUM_KV_BLOCKS = 64


def verify_manager() -> HpuBucketManager:
    limits = ServingLimits(8, 512, 256, BLOCK)
    config = BucketingConfig.from_limits(
        limits, read_envs({"VLLM_HPU_BUCKETING_STRATEGY": "linear"})
    )
    manager = HpuBucketManager(dataclasses.replace(config, verify_queries=QUERIES))
    manager.set_num_kv_blocks(NUM_KV_BLOCKS)
    return manager


def test_each_decode_bucket_has_a_verification_twin():
    manager = verify_manager()
    decode = [b for b in manager.decode_buckets if b.query_len == 1]
    verify = [b for b in manager.decode_buckets if b.query_len != 1]
    twins = {Bucket(b.batch_size, QUERIES, b.num_blocks) for b in decode}
    assert decode and twins <= set(verify)
    found = manager.find_decode_bucket(3, 5, QUERIES)
    assert found.query_len == QUERIES and found in verify
    assert found.batch_size >= 3 and found.num_blocks >= 5
    # A plain decode never pads into a verification bucket, nor the reverse.
    assert manager.find_decode_bucket(3, 5).query_len == 1
    assert manager.misses["decode"] == 0


def test_verification_ladder_has_rungs_of_one_and_two_blocks_per_group():
    """Below each batch size's lowest decode bucket: a group of Q queries
    reads each padding block Q times, so short sequences get tight rungs."""
    decode = [Bucket(1, 1, 4), Bucket(4, 1, 10), Bucket(4, 1, 16), Bucket(8, 1, 12)]
    assert verification_buckets(decode, QUERIES, max_groups=1) == [
        Bucket(1, QUERIES, 1),
        Bucket(1, QUERIES, 2),
        Bucket(1, QUERIES, 4),
        Bucket(4, QUERIES, 4),
        Bucket(4, QUERIES, 8),
        Bucket(4, QUERIES, 10),
        Bucket(4, QUERIES, 16),
        Bucket(8, QUERIES, 8),
        Bucket(8, QUERIES, 12),
    ]
    manager = verify_manager()
    manager.use_buckets([], decode)
    assert manager.find_decode_bucket(4, 5, QUERIES) == Bucket(4, QUERIES, 8)
    assert manager.find_decode_bucket(4, 5) == Bucket(4, 1, 10)


def test_verification_ladder_has_batch_rungs_between_decode_sizes():
    """Halfway between two decode batch sizes (up to max_num_seqs), with the
    upper size's block counts scaled down: five query groups pad to six, not
    eight, while plain decodes keep the decode ladder."""
    decode = [Bucket(1, 1, 4), Bucket(4, 1, 10), Bucket(4, 1, 16), Bucket(8, 1, 12)]
    rungs = verification_buckets(decode, QUERIES, max_groups=8)
    middle = sorted({b for b in rungs if b.batch_size not in (1, 4, 8)})
    # 2: 10 and 16 blocks halved, with rungs of 1 and 2 blocks per group
    # below; 6: 12 blocks times 6/8, and 6 blocks (one per group) below.
    assert middle == [
        Bucket(2, QUERIES, 2),
        Bucket(2, QUERIES, 4),
        Bucket(2, QUERIES, 5),
        Bucket(2, QUERIES, 8),
        Bucket(6, QUERIES, 6),
        Bucket(6, QUERIES, 9),
    ]
    assert not {b.batch_size for b in verification_buckets(decode, QUERIES, 5)} & {6}
    manager = verify_manager()  # 8 sequences at most
    manager.use_buckets([], decode)
    assert manager.find_decode_bucket(3, 5, QUERIES) == Bucket(4, QUERIES, 8)
    assert manager.find_decode_bucket(5, 9, QUERIES) == Bucket(6, QUERIES, 9)
    assert manager.find_decode_bucket(2, 5, QUERIES) == Bucket(2, QUERIES, 5)
    # More blocks than the rung holds: the next batch size's buckets.
    assert manager.find_decode_bucket(5, 10, QUERIES) == Bucket(8, QUERIES, 12)
    assert manager.find_decode_bucket(2, 5) == Bucket(4, 1, 10)
    assert manager.misses["decode"] == 0


def test_rows_with_drafts_plan_as_decode_rows():
    drafted = ScheduledSeq(0, SeqLayout([0, 1], 20, QUERIES))
    prompt = ScheduledSeq(1, SeqLayout([2, 3], 0, QUERIES))
    decode = ScheduledSeq(2, SeqLayout([4], 9, 1))
    prompts, decodes = split_by_phase(
        [drafted, prompt, decode], 2, drafted_rows=frozenset({0})
    )
    assert prompts == [prompt] and decodes == [drafted, decode]


def test_verification_pass_packs_short_rows_into_groups():
    manager = verify_manager()
    cache = CacheGeometry(BLOCK, NUM_KV_BLOCKS, torch.float32, torch.device("cpu"))
    seqs = [
        ScheduledSeq(0, SeqLayout([5, 6], 14, 4)),  # crosses into its 2nd block
        ScheduledSeq(2, SeqLayout([7], 3, 2)),
        ScheduledSeq(3, SeqLayout([8, 9, 10], 40, 1)),  # no drafts: one query
    ]
    token_ids = np.arange(4 * 64).reshape(4, 64)
    forward_pass = build_decode_pass(seqs, manager, token_ids, cache, QUERIES)

    bucket = forward_pass.bucket
    assert not forward_pass.is_prompt
    # Rows 2 and 3 share the second group of Q slots: two groups in all.
    assert bucket.query_len == QUERIES and bucket.batch_size == 2
    assert bucket.num_blocks >= 2 + 1 + 3
    assert forward_pass.num_tokens == bucket.batch_size * QUERIES
    ids = forward_pass.input_ids.view(-1, QUERIES)
    positions = forward_pass.positions.view(-1, QUERIES)
    assert ids[0].tolist() == token_ids[0, 14:18].tolist()
    assert ids[1].tolist() == [*token_ids[2, 3:5], token_ids[3, 40], 0]
    assert positions[0].tolist() == [14, 15, 16, 17]
    assert positions[1].tolist() == [3, 4, 40, 0]
    assert forward_pass.first_token_indices == [0, QUERIES, QUERIES + 2]
    assert forward_pass.last_token_indices == [3, QUERIES + 1, QUERIES + 2]
    slots = forward_pass.attn_metadata.slot_mapping.view(-1, QUERIES)
    assert slots[0].tolist() == [
        5 * BLOCK + 14,
        5 * BLOCK + 15,
        6 * BLOCK,
        6 * BLOCK + 1,
    ]
    assert slots[1, :3].tolist() == [7 * BLOCK + 3, 7 * BLOCK + 4, 10 * BLOCK + 8]
    assert slots[1, 3] // BLOCK == NUM_KV_BLOCKS  # padding: dummy block
    blocks = forward_pass.attn_metadata.decode_blocks()
    assert blocks.block_list.shape == (bucket.num_blocks,)
    assert blocks.block_bias.shape == (bucket.num_blocks, QUERIES, 1, BLOCK)
    # Row 3's blocks belong to group 1, and only its slot (and the free slot
    # after it) sees them.
    hidden = blocks.block_bias[..., 0, :] < 0  # [P, Q, B]
    row3 = (blocks.block_list == 10).nonzero().item()
    assert blocks.block_groups[row3] == 1
    assert hidden[row3, :2].all() and not hidden[row3, 2:, :9].any()
