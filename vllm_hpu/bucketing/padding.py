"""Padding waste: live counters and trace replay. Ratio = padded / (real +
padded); decode reports batch (sequence) and block padding separately."""

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from vllm_hpu.bucketing.buckets import Bucket


class BucketLookup(Protocol):
    """What padding a trace needs of ``HpuBucketManager`` (which imports this)."""

    def find_prompt_bucket(
        self, batch_size: int, query_len: int, num_context_blocks: int
    ) -> "Bucket": ...

    def find_decode_bucket(self, batch_size: int, num_blocks: int) -> "Bucket": ...


@dataclasses.dataclass
class PaddingCounter:
    """Real and padded units (tokens, sequences or blocks) over many steps."""

    steps: int = 0
    real: int = 0
    padded: int = 0

    def add(self, real: int, computed: int) -> None:
        self.steps += 1
        self.real += real
        self.padded += computed - real

    @property
    def ratio(self) -> float:
        total = self.real + self.padded
        return self.padded / total if total else 0.0

    def describe(self, unit: str) -> str:
        return f"{self.real} real / {self.padded} padded {unit} ({self.ratio:.1%})"


@dataclasses.dataclass
class PaddingStats:
    """Padding of every step the runner recorded, per phase."""

    prompt: PaddingCounter = dataclasses.field(default_factory=PaddingCounter)
    # A decode step computes one token per sequence: batch padding is token padding.
    decode_batch: PaddingCounter = dataclasses.field(default_factory=PaddingCounter)
    decode_blocks: PaddingCounter = dataclasses.field(default_factory=PaddingCounter)
    # Verification passes: tokens; their blocks count as decode blocks.
    verify: PaddingCounter = dataclasses.field(default_factory=PaddingCounter)

    def record_prompt(self, bucket: "Bucket", query_lens: list[int]) -> None:
        self.prompt.add(sum(query_lens), bucket.batch_size * bucket.query_len)

    def record_decode(self, bucket: "Bucket", num_seqs: int, num_blocks: int) -> None:
        self.decode_batch.add(num_seqs, bucket.batch_size)
        self.decode_blocks.add(num_blocks, bucket.num_blocks)

    def record_verify(
        self, bucket: "Bucket", query_lens: list[int], num_blocks: int
    ) -> None:
        self.verify.add(sum(query_lens), bucket.batch_size * bucket.query_len)
        self.decode_blocks.add(num_blocks, bucket.num_blocks)

    def summary(self) -> str:
        return (
            f"Padding: prompt {self.prompt.steps} steps, "
            f"{self.prompt.describe('tokens')}; "
            f"decode {self.decode_batch.steps} steps, "
            f"batch {self.decode_batch.describe('tokens')}, "
            f"blocks {self.decode_blocks.describe('blocks')}; "
            f"verification {self.verify.steps} steps, "
            f"{self.verify.describe('tokens')}"
        )


class TraceStep(NamedTuple):
    """One step's real shape. ``lengths``: query lengths of a prompt batch, or
    block counts of the sequences of a decode batch (its batch size is len())."""

    phase: str
    lengths: tuple[int, ...]
    num_context_blocks: int = 0


def measure_padding(trace: Iterable[TraceStep], manager: BucketLookup) -> PaddingStats:
    """Pad every step of ``trace`` to ``manager``'s buckets and count the padding."""
    stats = PaddingStats()
    for step in trace:
        batch_size = len(step.lengths)
        if step.phase == "prompt":
            bucket = manager.find_prompt_bucket(
                batch_size, max(step.lengths), step.num_context_blocks
            )
            stats.record_prompt(bucket, list(step.lengths))
        elif step.phase == "decode":
            bucket = manager.find_decode_bucket(batch_size, sum(step.lengths))
            stats.record_decode(bucket, batch_size, sum(step.lengths))
        else:
            raise ValueError(f"unknown phase {step.phase!r}: use 'prompt' or 'decode'")
    return stats
