"""The graph capture budget planner, driven by a fake memory meter."""

import pytest

from vllm_hpu.bucketing import Bucket
from vllm_hpu.worker.compilation.graphs import (
    DECODE,
    PROMPT,
    CapturePlan,
    capture_graphs,
    capture_order,
    describe_budget,
    left_out_message,
)

GiB = 1 << 30
MiB = 1 << 20


def prompt_buckets(batch_sizes=(1, 2, 4), seq_lens=range(128, 1025, 128)):
    return [Bucket(bs, seq, 0) for bs in batch_sizes for seq in seq_lens]


def decode_buckets(batch_sizes=(1, 2, 4), num_blocks=range(1, 17)):
    return [Bucket(bs, 1, blocks) for bs in batch_sizes for blocks in num_blocks]


class FakeMeter:
    """A graph costs a fixed number of bytes per token (prompt) or sequence."""

    def __init__(self, prompt_per_token: int, decode_per_seq: int):
        self.per_unit = {PROMPT: prompt_per_token, DECODE: decode_per_seq}
        self.calls: list[tuple[str, Bucket]] = []

    def __call__(self, phase: str, bucket: Bucket) -> int:
        self.calls.append((phase, bucket))
        units = bucket.batch_size * (bucket.query_len if phase == PROMPT else 1)
        return units * self.per_unit[phase]


def test_capture_order_min_tokens_is_ascending_tokens():
    order = capture_order(prompt_buckets(), "min_tokens")
    tokens = [b.batch_size * b.query_len for b in order]
    assert tokens == sorted(tokens)
    assert order[:3] == [Bucket(1, 128, 0), Bucket(2, 128, 0), Bucket(1, 256, 0)]


def test_capture_order_max_bs_is_descending_batch_then_ascending_seq():
    order = capture_order(decode_buckets(), "max_bs")
    assert order[0] == Bucket(4, 1, 1)
    assert order[15] == Bucket(4, 1, 16)
    assert order[16] == Bucket(2, 1, 1)
    assert order[-1] == Bucket(1, 1, 16)


def test_capture_order_rejects_unknown_strategy():
    with pytest.raises(ValueError, match="strategy"):
        capture_order(prompt_buckets(), "random")


def test_capture_follows_strategy_order_within_budget():
    meter = FakeMeter(prompt_per_token=MiB, decode_per_seq=MiB)
    plan = CapturePlan(prompt_buckets(), decode_buckets(), 100 * GiB, 0.5)
    prompt, decode = capture_graphs(plan, meter)
    assert prompt.captured_all and decode.captured_all
    prompt_calls = [b for phase, b in meter.calls if phase == PROMPT]
    decode_calls = [b for phase, b in meter.calls if phase == DECODE]
    assert prompt_calls == capture_order(prompt_buckets(), "min_tokens")
    assert decode_calls == capture_order(decode_buckets(), "max_bs")
    # Every prompt graph is captured before any decode graph.
    assert meter.calls.index((DECODE, decode_calls[0])) == len(prompt_calls)


def test_budget_cuts_off_buckets_whose_estimate_does_not_fit():
    meter = FakeMeter(prompt_per_token=MiB, decode_per_seq=MiB)
    # Prompt buckets of bs 1 only: 128 .. 1024 MiB each; budget 1 GiB for prompts.
    plan = CapturePlan(prompt_buckets((1,)), [], 1 * GiB, 1.0)
    prompt, _ = capture_graphs(plan, meter)
    # 128 + 256 + 384 = 768 MiB; the 512 MiB estimate exceeds the 256 MiB left.
    assert prompt.captured == [Bucket(1, 128, 0), Bucket(1, 256, 0), Bucket(1, 384, 0)]
    assert prompt.used_mem == 768 * MiB
    assert not prompt.captured_all


def test_a_bucket_too_large_is_skipped_but_smaller_later_ones_fit():
    meter = FakeMeter(prompt_per_token=MiB, decode_per_seq=MiB)
    buckets = [Bucket(1, 1, 1), Bucket(4, 1, 1), Bucket(8, 1, 1)]
    plan = CapturePlan([], buckets, 10 * MiB, 0.0, decode_strategy="max_bs")
    _, decode = capture_graphs(plan, meter)
    # 8 sequences first (8 MiB, 2 MiB left); 4 would need 4 MiB: skipped; 1 fits.
    assert decode.captured == [Bucket(8, 1, 1), Bucket(1, 1, 1)]
    assert decode.used_mem == 9 * MiB


def test_leftover_decode_budget_spills_to_prompt():
    meter = FakeMeter(prompt_per_token=MiB, decode_per_seq=MiB)
    plan = CapturePlan(
        prompt_buckets((1,)), decode_buckets((1,), range(1, 3)), 2 * GiB, 0.25
    )
    prompt, decode = capture_graphs(plan, meter)
    assert decode.captured_all and decode.used_mem == 2 * MiB
    # 512 MiB alone allows 128 + 256; the spill-over adds 384 + 512 + 640.
    assert len(prompt.captured) == 5
    assert prompt.used_mem == (128 + 256 + 384 + 512 + 640) * MiB


def test_leftover_prompt_budget_spills_to_decode():
    meter = FakeMeter(prompt_per_token=1, decode_per_seq=100 * MiB)
    plan = CapturePlan(prompt_buckets((1,)), decode_buckets((1, 2, 4), (1,)), GiB, 0.7)
    prompt, decode = capture_graphs(plan, meter)
    assert prompt.captured_all
    # Decode share 307 MiB: bs 4 (400 MiB, first, always); the spill-over
    # (1 GiB - 400 MiB - prompts) then admits bs 2 and bs 1.
    assert decode.captured == [Bucket(4, 1, 1), Bucket(2, 1, 1), Bucket(1, 1, 1)]


def test_documented_example_all_decode_and_part_of_prompt():
    """The documented run: 15.85 GiB for graphs, ratio 0.3; all 48 decode graphs
    (161.9 MiB) and 15 of 24 prompt graphs (14.03 GiB) captured."""
    meter = FakeMeter(prompt_per_token=int(2.5 * MiB), decode_per_seq=int(1.35 * MiB))
    plan = CapturePlan(prompt_buckets(), decode_buckets(), int(15.85 * GiB), 0.3)
    prompt, decode = capture_graphs(plan, meter)
    assert decode.captured_all and len(decode.order) == 48
    assert 0 < len(prompt.captured) < len(prompt.order) == 24
    assert prompt.used_mem + decode.used_mem <= plan.graph_mem
    # Prompts got more than their 30 % share: the spill-over from decode.
    assert prompt.used_mem > plan.prompt_budget
    line = prompt.summary(lambda phase, b: (b.batch_size, b.query_len))
    assert line.startswith(f"Graph/Prompt captured:{len(prompt.captured)} (")
    assert "buckets:[(1, 128), (1, 256)" in line
    assert decode.summary(lambda phase, b: (b.batch_size, b.num_blocks)).startswith(
        "Graph/Decode captured:48 (100.0%) used_mem:"
    )


def test_budget_line_has_documented_shape():
    plan = CapturePlan([], [], int(15.85 * GiB), 0.3)
    assert describe_budget(plan, int(55.43 * GiB)) == (
        "Using 15.85 GiB/55.43 GiB of free device memory for HPUGraphs, "
        "4.75 GiB for prompt and 11.09 GiB for decode (VLLM_GRAPH_PROMPT_RATIO=0.3)"
    )


class FakeDevice:
    """Free device memory that each captured graph takes its bytes from."""

    def __init__(self, free: int, meter: FakeMeter):
        self.free = free
        self.meter = meter

    def capture(self, phase: str, bucket: Bucket) -> int:
        used = self.meter(phase, bucket)
        if used > self.free:
            raise MemoryError(f"{bucket} does not fit in {self.free} bytes")
        self.free -= used
        return used


def test_free_memory_stops_capture_before_the_device_runs_out():
    """The budget would allow every graph, the device does not: capture stops
    where the estimate exceeds what is free, with one line naming the variable."""
    device = FakeDevice(free=10 * MiB, meter=FakeMeter(MiB, MiB))
    buckets = decode_buckets((1, 2, 4), (1,))
    plan = CapturePlan([], buckets, 100 * GiB, 0.0, decode_strategy="max_bs")
    phases = capture_graphs(plan, device.capture, lambda: device.free)
    # 4 sequences (4 MiB, 6 MiB left), 2 (2 MiB, 4 MiB left); 1 needs 1 MiB: fits.
    assert phases[1].captured == [Bucket(4, 1, 1), Bucket(2, 1, 1), Bucket(1, 1, 1)]
    assert left_out_message(phases, 0.1) is None

    device = FakeDevice(free=5 * MiB, meter=FakeMeter(MiB, MiB))
    phases = capture_graphs(plan, device.capture, lambda: device.free)
    # 4 sequences (1 MiB left); 2 would need 2 MiB: left out; 1 fits.
    assert phases[1].captured == [Bucket(4, 1, 1), Bucket(1, 1, 1)]
    assert left_out_message(phases, 0.1) == (
        "1 of 3 buckets were left out of graph capture (they run uncaptured, "
        "slower on the host): the graph memory budget or the free device memory "
        "ran out; raise VLLM_GRAPH_RESERVED_MEM (now 0.1) to capture them."
    )


def test_no_free_memory_captures_nothing_and_says_so():
    device = FakeDevice(free=0, meter=FakeMeter(MiB, MiB))
    plan = CapturePlan(prompt_buckets((1,)), decode_buckets((1,)), GiB, 0.3)
    phases = capture_graphs(plan, device.capture, lambda: device.free)
    assert device.meter.calls == []
    message = left_out_message(phases, 0.3)
    assert message is not None and message.startswith("24 of 24 buckets were left")
