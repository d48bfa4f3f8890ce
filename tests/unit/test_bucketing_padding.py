"""Padding statistics, trace replay, and the bucket-listing command."""

from pathlib import Path

import pytest

from vllm_hpu.bucketing import (
    Bucket,
    BucketingConfig,
    HpuBucketManager,
    PaddingStats,
    ServingLimits,
    TraceStep,
    measure_padding,
)
from vllm_hpu.bucketing.__main__ import main
from vllm_hpu.envs import read_envs

TRACES = Path(__file__).parents[2] / "benchmarks" / "traces"

# These tests are about the range (linear/exponential) strategies.
# One row per prompt: these tests pin the unpacked prompt buckets.
LINEAR = {"VLLM_HPU_BUCKETING_STRATEGY": "linear", "VLLM_HPU_MERGED_PREFILL": "false"}


def doc_manager():
    environ = {"VLLM_PROMPT_BS_BUCKET_MAX": "4", "VLLM_PROMPT_SEQ_BUCKET_MAX": "1024"}
    limits = ServingLimits(128, 4096, 1024, 128)
    manager = HpuBucketManager(
        BucketingConfig.from_limits(limits, read_envs({**LINEAR, **environ}))
    )
    manager.set_num_kv_blocks(4096)
    return manager


def test_record_prompt_counts_tokens_and_ratio():
    stats = PaddingStats()
    stats.record_prompt(Bucket(4, 512, 0), [412, 400, 300])
    assert (stats.prompt.steps, stats.prompt.real, stats.prompt.padded) == (
        1,
        1112,
        936,
    )
    assert stats.prompt.ratio == pytest.approx(936 / 2048)


def test_record_decode_counts_batch_and_block_padding():
    stats = PaddingStats()
    stats.record_decode(Bucket(4, 1, 32), num_seqs=3, num_blocks=12)
    stats.record_decode(Bucket(2, 1, 16), num_seqs=2, num_blocks=8)
    assert (stats.decode_batch.real, stats.decode_batch.padded) == (5, 1)
    assert (stats.decode_blocks.real, stats.decode_blocks.padded) == (20, 28)
    assert stats.decode_blocks.ratio == pytest.approx(28 / 48)


def test_summary_reports_every_counter():
    stats = PaddingStats()
    assert stats.prompt.ratio == 0.0
    stats.record_prompt(Bucket(1, 128, 0), [100])
    stats.record_decode(Bucket(2, 1, 16), num_seqs=1, num_blocks=4)
    stats.record_verify(Bucket(2, 4, 8), query_lens=[4, 2], num_blocks=8)
    assert stats.summary() == (
        "Padding: prompt 1 steps, 100 real / 28 padded tokens (21.9%); "
        "decode 1 steps, batch 1 real / 1 padded tokens (50.0%), "
        "blocks 12 real / 12 padded blocks (50.0%); "
        "verification 1 steps, 6 real / 2 padded tokens (25.0%)"
    )


def test_measure_padding_replays_a_trace():
    trace = [
        TraceStep("prompt", (412, 400, 300)),
        TraceStep("decode", (4, 4, 4)),
        TraceStep("decode", (4, 4)),
    ]
    stats = measure_padding(trace, doc_manager())
    assert (stats.prompt.real, stats.prompt.padded) == (1112, 936)
    assert (stats.decode_batch.real, stats.decode_batch.padded) == (5, 1)
    # Default decode blocks 1, 2, 4, 8, 16, 32, ...: 12 blocks pad to 16, 8 fit.
    assert (stats.decode_blocks.real, stats.decode_blocks.padded) == (20, 4)


def test_measure_padding_rejects_unknown_phase():
    with pytest.raises(ValueError, match="unknown phase 'mixed'"):
        measure_padding([TraceStep("mixed", (1,))], doc_manager())


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            [
                "--strategy",
                "linear",
                "--no-prefix-caching",
                "--no-chunked-prefill",
                "--max-num-seqs",
                "4",
                "--max-model-len",
                "1024",
                "--max-num-batched-tokens",
                "4096",
                "--no-merged-prefill",
            ],
            # Decode: batch sizes 1, 2, 4, each with the block counts from its
            # size up to 8 blocks per sequence (1024 tokens): 4 + 4 + 4.
            "36 buckets (linear): 24 prompt + 12 decode",
        ),
        (
            ["--max-num-seqs", "4", "--max-model-len", "1024", "--exponential"],
            "buckets (exponential)",
        ),
        (
            ["--trace", str(TRACES / "example.jsonl"), "--graph-cost-s", "60"],
            "40 buckets (compact): 16 prompt + 24 decode\nwarmup: 40 forward steps, "
            "then up to 40 graph captures as the graph memory budget allows; at 60 s "
            "per bucket about 40 min\nprompt passes: merged prefill (a step's prompts "
            "packed into one sequence)\ntrace: 251 steps,",
        ),
    ],
)
def test_command_prints_counts_and_warmup(argv, expected, capsys):
    main(argv)
    out = capsys.readouterr().out
    assert expected in out
    assert "warmup:" in out


def test_command_plans_a_bucket_file_for_a_trace(tmp_path, capsys):
    out_file = tmp_path / "plan.txt"
    argv = ["--trace", str(TRACES / "chat.jsonl"), "--plan-out", str(out_file)]
    main([*argv, "--budget", "20"])
    out = capsys.readouterr().out
    assert f"to {out_file}" in out
    assert "buckets (file)" in out and "0 not warmed up" in out
    assert out_file.read_text().startswith("# Planned by python -m vllm_hpu.bucketing")
