"""Bucket strategies: the compact default, bucket files,
step traces, the planner, and which strategy a configuration resolves to."""

import math
from pathlib import Path

import pytest

from vllm_hpu.bucketing import Bucket, BucketingConfig, HpuBucketManager, ServingLimits
from vllm_hpu.bucketing.bucket_file import (
    BucketSets,
    format_buckets,
    parse_buckets,
    read_bucket_file,
    write_bucket_file,
)
from vllm_hpu.bucketing.bucket_planner import plan_buckets, traced_shapes
from vllm_hpu.bucketing.replay import replay_trace
from vllm_hpu.bucketing.trace import PromptChunk, StepShape, StepTrace, TraceRecorder
from vllm_hpu.envs import read_envs

TRACES = Path(__file__).parents[2] / "benchmarks" / "traces"
# The reference stack's example configuration (issue 26).
EXAMPLE = ServingLimits(64, 2048, 4096, 128, use_context_buckets=True)
# One row per prompt (VLLM_HPU_MERGED_PREFILL=false): batch sizes above 1.
UNPACKED = {"VLLM_HPU_MERGED_PREFILL": "false"}


def manager_for(environ, limits=EXAMPLE, num_kv_blocks=1000):
    config = BucketingConfig.from_limits(limits, read_envs(environ))
    manager = HpuBucketManager(config, exact_shapes=False)
    manager.set_num_kv_blocks(num_kv_blocks)
    return manager


@pytest.mark.parametrize(
    ("environ", "counts"),
    [
        # compact with merged prefill, the default: at most 40 graphs (issue 54;
        # 46 before it, the reference's 106): prompt tokens 64..2048, three of
        # them with context; decode 1, 2, 4 blocks per sequence, the largest
        # batch's block counts growing by sqrt(2) up to the KV cache.
        ({}, (16, 24)),
        ({**UNPACKED}, (25, 24)),
        ({"VLLM_HPU_BUCKETING_STRATEGY": "linear", **UNPACKED}, (296, 195)),
        ({"VLLM_EXPONENTIAL_BUCKETING": "1", **UNPACKED}, (214, 61)),
        # The reference's default and its merged-prefill mode.
        ({"VLLM_HPU_BUCKETING_STRATEGY": "reference"}, (63, 43)),
        ({"VLLM_HPU_BUCKETING_STRATEGY": "reference-merged"}, (28, 43)),
    ],
)
def test_strategy_graph_counts_for_the_example_configuration(environ, counts):
    manager = manager_for(environ)
    assert (len(manager.prompt_buckets), len(manager.decode_buckets)) == counts


def test_user_ranges_win_over_the_compact_set_for_their_phase():
    manager = manager_for({"VLLM_PROMPT_BS_BUCKET_MAX": "4", **UNPACKED})
    assert manager.config.prompt_strategy == "linear"
    assert manager.config.decode_strategy == "compact"
    assert max(b.batch_size for b in manager.prompt_buckets) == 4


@pytest.mark.parametrize("limits", [EXAMPLE, ServingLimits(8, 2048, 8192, 128, True)])
def test_compact_buckets_hold_every_shape_within_the_limits(limits):
    """The fullest legal prompt and decode shapes find a listed bucket."""
    manager = manager_for({}, limits, num_kv_blocks=512)
    longest = limits.max_num_batched_tokens
    assert manager.has_prompt_bucket(1, longest, 0)
    assert manager.has_prompt_bucket(1, 1, math.ceil((limits.max_model_len - 1) / 128))
    assert all(b.num_blocks <= 512 for b in manager.decode_buckets)
    assert manager.find_decode_bucket(limits.max_num_seqs, 512).num_blocks == 512
    assert sum(manager.misses.values()) == 0


def test_bucket_file_round_trips(tmp_path):
    sets = BucketSets(
        [Bucket(1, 128, 0), Bucket(1, 256, 4), Bucket(4, 512, 0)],
        [Bucket(1, 1, 8), Bucket(64, 1, 1000)],
    )
    path = tmp_path / "buckets.txt"
    write_bucket_file(path, sets, header="planned\nfor a test")
    assert read_bucket_file(path) == sets


def test_bucket_file_reads_the_reference_format_with_products():
    lines = [
        "# comment",
        "",
        "(1, 2048, 0)",
        "(1, [256, 512], [0, 4, 8])  # six",
        "(64, 1, 1024)",
    ]
    sets = parse_buckets(lines, "sample")
    assert len(sets.prompt) == 7 and sets.decode == [Bucket(64, 1, 1024)]
    assert parse_buckets(format_buckets(sets).splitlines(), "again") == sets


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("(1, 128)", "line 1: .* not a 3-tuple"),
        ("(1, x, 0)", "line 1"),
        ("(1, -5, 0)", "line 1"),
    ],
)
def test_bad_bucket_file_lines_name_the_line(line, message):
    with pytest.raises(ValueError, match=message):
        parse_buckets([line, "(1, 1, 4)"], "bad")


def test_bucket_file_strategy_is_used_by_the_manager(tmp_path):
    path = tmp_path / "buckets.txt"
    write_bucket_file(path, BucketSets([Bucket(2, 256, 0)], [Bucket(8, 1, 64)]))
    manager = manager_for({"VLLM_BUCKETING_FROM_FILE": str(path), **UNPACKED})
    assert manager.prompt_buckets == [Bucket(2, 256, 0)]
    assert manager.decode_buckets == [Bucket(8, 1, 64)]


def test_merged_prefill_refuses_a_bucket_file_without_one_row_buckets(tmp_path):
    path = tmp_path / "buckets.txt"
    write_bucket_file(path, BucketSets([Bucket(2, 256, 0)], [Bucket(8, 1, 64)]))
    with pytest.raises(ValueError, match="VLLM_HPU_MERGED_PREFILL=false"):
        manager_for({"VLLM_BUCKETING_FROM_FILE": str(path)})


def small_trace() -> StepTrace:
    steps = (
        StepShape((PromptChunk(300, 0), PromptChunk(40, 0), PromptChunk(500, 256)), ()),
        StepShape((PromptChunk(100, 0),), (3, 1, 2)),
        StepShape((), (3, 2, 2, 1)),
        StepShape((), tuple([4] * 40)),
    )
    return StepTrace(128, 64, 2048, 4096, 1000, steps)


def test_step_trace_round_trips(tmp_path):
    trace = small_trace()
    trace.save(tmp_path / "trace.jsonl")
    assert StepTrace.load(tmp_path / "trace.jsonl") == trace


@pytest.mark.parametrize("budget", [1, 5, 53])
@pytest.mark.parametrize("source", ["small", "example.jsonl", "chat.jsonl"])
def test_planner_leaves_no_traced_shape_without_a_bucket(source, budget):
    trace = small_trace() if source == "small" else StepTrace.load(TRACES / source)
    manager = manager_for({}, num_kv_blocks=trace.num_kv_blocks)
    sets = plan_buckets(trace, manager.config, budget)
    manager.use_buckets(sets.prompt, sets.decode)
    result = replay_trace(trace, manager)
    assert result.misses == 0
    prompt_shapes, decode_shapes = traced_shapes(trace, manager.config)
    assert all(manager.has_prompt_bucket(*shape) for shape in prompt_shapes)
    for shape in decode_shapes:
        manager.find_decode_bucket(shape.batch_size, shape.num_blocks)
    assert sum(manager.misses.values()) == 0
    assert len(sets.prompt) + len(sets.decode) >= 2


def test_planner_pads_its_trace_less_with_a_larger_budget():
    trace = StepTrace.load(TRACES / "example.jsonl")
    manager = manager_for({})
    padding = []
    for budget in (4, 40):
        sets = plan_buckets(trace, manager.config, budget)
        manager.use_buckets(sets.prompt, sets.decode)
        padding.append(replay_trace(trace, manager).stats.decode_blocks.padded)
    assert padding[1] < padding[0]


def test_trace_recorder_writes_what_a_trace_loads(tmp_path):
    trace = small_trace()
    recorder = TraceRecorder(tmp_path / "sub" / "trace.jsonl")
    recorder.record(trace.steps[0])  # before start (warmup): not recorded
    header = trace.header()
    del header["version"]
    recorder.start(header)
    for step in trace.steps:
        recorder.record(step)
    assert StepTrace.load(tmp_path / "sub" / "trace.jsonl") == trace


def test_compact_manager_logs_its_strategy(vllm_log):
    manager_for({})
    assert "Prompt buckets: compact (strategy)" in vllm_log.messages()
    assert any(m.startswith("Generated 16 prompt buckets") for m in vllm_log.messages())
