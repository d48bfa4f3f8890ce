"""The device memory split: KV cache versus graph memory (hpu-algorithms.md §6)."""

from dataclasses import dataclass

from vllm.utils.mem_utils import format_gib


@dataclass(frozen=True)
class MemorySplit:
    free: int  # free device memory after weights and the profiling run
    usable: int  # free * gpu_memory_utilization
    graph: int  # usable * VLLM_GRAPH_RESERVED_MEM
    kv_cache: int  # what is left for KV blocks

    def describe(self, gpu_memory_utilization: float, graph_reserved_mem: float) -> str:
        return (
            f"Free device memory: {format_gib(self.free)} GiB, "
            f"{format_gib(self.usable)} GiB usable "
            f"(gpu_memory_utilization={gpu_memory_utilization}), "
            f"{format_gib(self.graph)} GiB reserved for HPUGraphs "
            f"(VLLM_GRAPH_RESERVED_MEM={graph_reserved_mem}), "
            f"{format_gib(self.kv_cache)} GiB reserved for KV cache"
        )


def split_memory(
    free: int, gpu_memory_utilization: float, graph_reserved_mem: float
) -> MemorySplit:
    """Usable memory is a share of what is free; graphs take a share of that."""
    usable = int(free * gpu_memory_utilization)
    graph = int(usable * graph_reserved_mem)
    return MemorySplit(free=free, usable=usable, graph=graph, kv_cache=usable - graph)
