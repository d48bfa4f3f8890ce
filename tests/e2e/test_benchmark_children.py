"""The benchmark's plugin children, launched as benchmarks.run launches them, on
tiny-llama: a runner change that breaks a probe fails here, not 30 minutes into
a benchmark run."""

import argparse
import dataclasses
import math
import sys

import pytest
from models import model_path

from benchmarks import run
from benchmarks.overhead import BATCH_SIZES
from benchmarks.results_schema import PROFILE_ALL
from benchmarks.systems import OVERHEAD_CHILD, OVERHEAD_SYSTEM, PROFILE_CHILD
from benchmarks.workload import (
    QUICK_OUTPUT_MAX,
    WorkloadSpec,
    make_workload,
    save_workload,
    text_token_ids,
)

pytestmark = pytest.mark.slow

SYSTEM = dataclasses.replace(
    OVERHEAD_SYSTEM,
    llm_kwargs=OVERHEAD_SYSTEM.llm_kwargs | {"kv_cache_memory_bytes": 256 << 20},
)


@pytest.fixture
def args() -> argparse.Namespace:
    return argparse.Namespace(
        model=model_path("tiny-llama"), dtype="float32", threads=2, stamp="test"
    )


@pytest.fixture
def workload(tmp_path) -> str:
    spec = WorkloadSpec(num_requests=6, output_max=QUICK_OUTPUT_MAX)
    path = tmp_path / "workload.json"
    save_workload(make_workload(spec, text_token_ids({0, 1, 2}, 1024)), path)
    return str(path)


def test_plugin_system_reports_its_figures(args, workload, tmp_path):
    out = tmp_path / "system.json"
    command = run.child_command(SYSTEM.child, SYSTEM, args, out)
    command += ["--workload", workload, "--plugin"]

    result = run.run_child(SYSTEM, command, sys.executable, out, args.threads)

    assert result.status == "ok", result.note
    assert result.num_requests == 6
    assert result.elapsed_s is not None and result.elapsed_s > 0
    assert result.buckets and result.buckets["prompt"] > 0
    assert result.padding and set(result.padding) >= {"prompt", "decode_batch"}
    assert result.ttft_s and result.itl_s


def test_overhead_probe_times_every_batch_size(args, tmp_path):
    out = tmp_path / "overhead.json"
    command = run.child_command(OVERHEAD_CHILD, SYSTEM, args, out)

    result = run.run_child(SYSTEM, command, sys.executable, out, args.threads)

    assert result.status == "ok", result.note
    assert result.overhead is not None
    assert [row["batch_size"] for row in result.overhead] == list(BATCH_SIZES)
    for row in result.overhead:
        assert row["steps"] > 0
        figures = [v for k, v in row.items() if k.endswith("_ms")]
        assert all(math.isfinite(v) and v >= 0 for v in figures), row
        assert row["forward_ms"] > 0


def test_profile_splits_operator_time_by_attention_region(args, workload, tmp_path):
    out = tmp_path / "profile.json"
    command = run.child_command(PROFILE_CHILD, SYSTEM, args, out)
    command += ["--workload", workload]

    result = run.run_child(SYSTEM, command, sys.executable, out, args.threads)

    assert result.status == "ok", result.note
    assert result.num_requests == 6 and result.output_tokens > 0
    split = result.profile
    assert split is not None
    assert set(split) == {PROFILE_ALL, "decode attention", "prompt attention"}
    # Flat decode attention gathers blocks and multiplies them (spec section 2).
    assert split["decode attention"]["aten::index_select"] > 0
    assert split["decode attention"]["aten::bmm"] > 0
    for region in ("decode attention", "prompt attention"):
        for name, seconds in split[region].items():
            assert 0 <= seconds <= split[PROFILE_ALL][name]
