"""The documented device memory split (hpu-algorithms.md section 6)."""

from vllm_hpu.worker.warmup.memory import split_memory

GiB = 1 << 30


def test_memory_split_matches_documented_example():
    # The documented log: 79.16 GiB free, utilization 0.5, reserved 0.4.
    split = split_memory(int(79.16 * GiB), 0.5, 0.4)
    assert round(split.usable / GiB, 2) == 39.58
    assert round(split.graph / GiB, 2) == 15.83
    assert round(split.kv_cache / GiB, 2) == 23.75
    line = split.describe(0.5, 0.4)
    assert line.startswith("Free device memory: 79.16 GiB, 39.58 GiB usable")
    assert "15.83 GiB reserved for HPUGraphs (VLLM_GRAPH_RESERVED_MEM=0.4)" in line
    assert line.endswith("23.75 GiB reserved for KV cache")


def test_memory_split_without_graphs_gives_all_usable_to_kv():
    split = split_memory(10 * GiB, 0.9, 0.0)
    assert split.graph == 0
    assert split.kv_cache == split.usable == 9 * GiB
