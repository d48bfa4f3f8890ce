"""The graph capture budget (hpu-algorithms.md section 6): pure arithmetic over
buckets and a ``capture(phase, bucket) -> bytes`` meter (faked in tests)."""

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from vllm.utils.mem_utils import format_gib

from vllm_hpu.bucketing import Bucket

PROMPT = "prompt"
DECODE = "decode"
# A tiny denominator so the first bucket's estimate is 0: it is always captured.
_NO_UNITS = 1e-3

CaptureFn = Callable[[str, Bucket], int]
FreeFn = Callable[[], int]  # free device memory now, in bytes


def unlimited() -> int:
    """A free-memory meter that never runs out (the budget alone decides)."""
    return sys.maxsize


def capture_order(buckets: list[Bucket], strategy: str) -> list[Bucket]:
    """``min_tokens``: fewest tokens first; ``max_bs``: largest batch first."""
    if strategy == "min_tokens":
        return sorted(buckets, key=lambda b: (b.batch_size * b.query_len, *b[1:], b[0]))
    if strategy == "max_bs":
        return sorted(buckets, key=lambda b: (-b.batch_size, b.query_len, b.num_blocks))
    raise ValueError(f"unknown graph capture strategy {strategy!r}")


def memory_units(phase: str, bucket: Bucket) -> int:
    """What a graph's memory grows with: tokens for prompts, sequences for decode."""
    if phase == PROMPT:
        return bucket.batch_size * bucket.query_len
    return bucket.batch_size


@dataclass
class PhaseCapture:
    """One phase's candidates in capture order, and what was captured so far."""

    phase: str
    order: list[Bucket]
    captured: list[Bucket] = field(default_factory=list)
    used_mem: int = 0
    units: float = _NO_UNITS

    @property
    def captured_all(self) -> bool:
        return len(self.captured) == len(self.order)

    def estimate(self, bucket: Bucket) -> float:
        """Memory of a graph, extrapolated from the bytes per unit measured so far."""
        return memory_units(self.phase, bucket) / self.units * self.used_mem

    def summary(self, describe: Callable[[str, Bucket], tuple[int, ...]]) -> str:
        share = len(self.captured) / len(self.order) if self.order else 1.0
        shapes = ", ".join(str(describe(self.phase, b)) for b in sorted(self.captured))
        return (
            f"Graph/{self.phase.capitalize()} captured:{len(self.captured)} "
            f"({share:.1%}) used_mem:{format_gib(self.used_mem)} GiB "
            f"buckets:[{shapes}]"
        )


def capture_within(
    state: PhaseCapture, budget: int, capture: CaptureFn, free: FreeFn
) -> int:
    """Capture in order every bucket fitting the rest of ``budget`` and free memory
    (others run uncaptured); returns the budget left."""
    for bucket in state.order:
        if bucket in state.captured:
            continue
        if state.estimate(bucket) >= min(budget, free()):
            continue
        used = max(0, capture(state.phase, bucket))
        state.captured.append(bucket)
        state.used_mem += used
        state.units += memory_units(state.phase, bucket)
        budget -= used
    return budget


@dataclass(frozen=True)
class CapturePlan:
    prompt_buckets: list[Bucket]
    decode_buckets: list[Bucket]
    graph_mem: int  # bytes kept for graphs (VLLM_GRAPH_RESERVED_MEM)
    prompt_ratio: float  # VLLM_GRAPH_PROMPT_RATIO
    prompt_strategy: str = "min_tokens"
    decode_strategy: str = "max_bs"

    @property
    def prompt_budget(self) -> int:
        return int(self.graph_mem * self.prompt_ratio)

    @property
    def decode_budget(self) -> int:
        return self.graph_mem - self.prompt_budget


def capture_graphs(
    plan: CapturePlan, capture: CaptureFn, free: FreeFn = unlimited
) -> tuple[PhaseCapture, PhaseCapture]:
    """Each phase within its share; then the budget one phase left, once it has
    everything, goes to the other phase. ``free`` is checked before each graph."""
    prompt = PhaseCapture(
        PROMPT, capture_order(plan.prompt_buckets, plan.prompt_strategy)
    )
    decode = PhaseCapture(
        DECODE, capture_order(plan.decode_buckets, plan.decode_strategy)
    )
    capture_within(prompt, plan.prompt_budget, capture, free)
    capture_within(decode, plan.decode_budget, capture, free)
    left = plan.graph_mem - prompt.used_mem - decode.used_mem
    if decode.captured_all and not prompt.captured_all:
        capture_within(prompt, left, capture, free)
    elif prompt.captured_all and not decode.captured_all:
        capture_within(decode, left, capture, free)
    return prompt, decode


def left_out_message(
    phases: tuple[PhaseCapture, PhaseCapture], graph_reserved_mem: float
) -> str | None:
    """One line when some buckets got no graph, naming the variable to raise."""
    left_out = sum(len(p.order) - len(p.captured) for p in phases)
    if not left_out:
        return None
    total = sum(len(p.order) for p in phases)
    return (
        f"{left_out} of {total} buckets were left out of graph capture (they run "
        "uncaptured, slower on the host): the graph memory budget or the free "
        "device memory ran out; raise VLLM_GRAPH_RESERVED_MEM (now "
        f"{graph_reserved_mem}) to capture them."
    )


def describe_budget(plan: CapturePlan, free: int) -> str:
    return (
        f"Using {format_gib(plan.graph_mem)} GiB/{format_gib(free)} GiB of free device "
        f"memory for HPUGraphs, {format_gib(plan.prompt_budget)} GiB for prompt and "
        f"{format_gib(plan.decode_budget)} GiB for decode "
        f"(VLLM_GRAPH_PROMPT_RATIO={plan.prompt_ratio})"
    )
