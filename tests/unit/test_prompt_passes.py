"""split_prefills: prompt chunks grouped into passes of similar length."""

import random

from vllm_hpu.attention.metadata import SeqLayout
from vllm_hpu.bucketing import BucketingConfig, HpuBucketManager, ServingLimits
from vllm_hpu.bucketing.prompt_passes import split_prefills
from vllm_hpu.envs import read_envs
from vllm_hpu.worker.passes.seqs import ScheduledSeq

BLOCK = 128
BUDGET = 2048


def manager(exact_shapes=False):
    limits = ServingLimits(64, BUDGET, 2048, BLOCK, True)
    # split_prefills is the unpacked mode's split (merged prefill packs instead).
    config = BucketingConfig.from_limits(
        limits, read_envs({"VLLM_HPU_MERGED_PREFILL": "false"})
    )
    return HpuBucketManager(config, exact_shapes=exact_shapes)


def chunks(query_lens, computed=None):
    computed = computed or [0] * len(query_lens)
    return [
        ScheduledSeq(row, SeqLayout([0] * 17, done, query_len))
        for row, (query_len, done) in enumerate(zip(query_lens, computed, strict=True))
    ]


def lengths(batches):
    return [[s.layout.num_scheduled_tokens for s in batch] for batch in batches]


def test_similar_chunks_share_one_pass_in_length_order():
    batches = split_prefills(chunks([90, 20, 60, 100]), BUDGET, manager(), BLOCK)
    assert lengths(batches) == [[20, 60, 90, 100]]


def test_a_long_chunk_does_not_stretch_short_rows():
    # Joined: 4 rows x 1024 = 4096 > budget anyway; 3 x 128 + 1 x 900 apart.
    batches = split_prefills(chunks([900, 30, 20, 25]), BUDGET, manager(), BLOCK)
    assert lengths(batches) == [[20, 25, 30], [900]]
    # Within the budget, still apart: 2 x 384 joined against 128 + 384 + a pass.
    batches = split_prefills(chunks([20, 300]), BUDGET, manager(), BLOCK)
    assert lengths(batches) == [[20], [300]]


def test_rows_times_longest_stays_within_the_budget():
    rng = random.Random(0)
    for _ in range(200):
        query_lens = [rng.randint(1, 1024) for _ in range(rng.randint(1, 40))]
        computed = [rng.choice([0, 256, 1000]) for _ in query_lens]
        seqs = chunks(query_lens, computed)
        batches = split_prefills(seqs, BUDGET, manager(), BLOCK)
        assert sorted(s.row for b in batches for s in b) == list(range(len(seqs)))
        for batch in batches:
            longest = max(s.layout.num_scheduled_tokens for s in batch)
            assert len(batch) == 1 or len(batch) * longest <= BUDGET


def test_exact_shapes_weigh_raw_lengths():
    batches = split_prefills(chunks([20, 60, 400]), BUDGET, manager(True), BLOCK)
    # 2 x 60 joined against 20 + 60 + a pass of 128; 3 x 400 against 120 + 400 + 128.
    assert lengths(batches) == [[20, 60], [400]]


def test_a_chunk_reading_blocks_written_this_step_runs_after_the_writer():
    # Row 0 (200 tokens) writes blocks 10, 11 and 12 here; row 1 got blocks 10 and
    # 11 as a prefix hit in the same step and computes 20 more tokens into block 13.
    writer = ScheduledSeq(0, SeqLayout([10, 11, 12], 0, 200))
    reader = ScheduledSeq(1, SeqLayout([10, 11, 13], 2 * BLOCK, 20))
    other = ScheduledSeq(2, SeqLayout([14], 0, 30))
    batches = split_prefills([reader, writer, other], BUDGET, manager(), BLOCK)
    assert [[s.row for s in batch] for batch in batches] == [[2, 0], [1]]


def test_a_dependency_in_a_later_kv_cache_group_orders_the_passes():
    # Hybrid KV cache manager: the first (windowed) group's table holds the null
    # block where the window has passed; the global group's table shows that
    # row 1 reads blocks 20 and 21, which row 0 writes in this step.
    writer = ScheduledSeq(
        0, SeqLayout([10, 11, 12], 0, 200), ([10, 11, 12], [20, 21, 22])
    )
    reader = ScheduledSeq(
        1, SeqLayout([0, 0, 13], 2 * BLOCK, 20), ([0, 0, 13], [20, 21, 23])
    )
    batches = split_prefills([reader, writer], BUDGET, manager(), BLOCK)
    assert [[s.row for s in batch] for batch in batches] == [[0], [1]]
