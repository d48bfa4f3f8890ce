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
from benchmarks.systems import OVERHEAD_CHILD, OVERHEAD_SYSTEM
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


def test_plugin_system_reports_its_figures(args, tmp_path):
    spec = WorkloadSpec(num_requests=6, output_max=QUICK_OUTPUT_MAX)
    args.workload = tmp_path / "workload.json"
    save_workload(make_workload(spec, text_token_ids({0, 1, 2}, 1024)), args.workload)
    out = tmp_path / "system.json"
    command = run.child_command(SYSTEM.child, SYSTEM, args, out)
    command += ["--workload", str(args.workload), "--plugin"]

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
