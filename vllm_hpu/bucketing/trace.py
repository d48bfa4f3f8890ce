"""Step-shape traces: every step's real shapes as JSON lines, written by the
runner (``VLLM_HPU_BUCKET_TRACE``) or the benchmark, read by replay and planner."""

import dataclasses
import json
import math
from pathlib import Path
from typing import IO, NamedTuple

TRACE_VERSION = 1


class PromptChunk(NamedTuple):
    """One prompt chunk of a step: tokens computed now, tokens already cached."""

    query_len: int
    num_computed_tokens: int

    def context_blocks(self, block_size: int) -> int:
        return math.ceil(self.num_computed_tokens / block_size)


@dataclasses.dataclass(frozen=True)
class StepShape:
    """One engine step: its prompt chunks and its decodes' KV block counts."""

    prompts: tuple[PromptChunk, ...] = ()
    decode_blocks: tuple[int, ...] = ()

    def to_json(self) -> str:
        return json.dumps(
            {"prompt": [list(c) for c in self.prompts], "decode": self.decode_blocks}
        )

    @classmethod
    def from_json(cls, line: str) -> "StepShape":
        item = json.loads(line)
        prompts = tuple(PromptChunk(*chunk) for chunk in item["prompt"])
        return cls(prompts, tuple(item["decode"]))


@dataclasses.dataclass(frozen=True)
class StepTrace:
    """A recorded run: the limits it ran under, then every step's shape."""

    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    num_kv_blocks: int
    steps: tuple[StepShape, ...]

    def header(self) -> dict[str, int]:
        fields = dataclasses.asdict(self)
        del fields["steps"]
        return {"version": TRACE_VERSION, **fields}

    def save(self, path: Path) -> None:
        lines = [json.dumps(self.header())] + [s.to_json() for s in self.steps]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")

    @classmethod
    def load(cls, path: Path) -> "StepTrace":
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        if not lines:
            raise ValueError(f"{path} is empty: a trace starts with a header line")
        header = json.loads(lines[0])
        if header.pop("version", None) != TRACE_VERSION:
            raise ValueError(
                f"{path} is not a version {TRACE_VERSION} step trace: record it "
                "again with VLLM_HPU_BUCKET_TRACE"
            )
        steps = tuple(StepShape.from_json(line) for line in lines[1:])
        return cls(steps=steps, **header)


class TraceRecorder:
    """Appends each step's shape to a trace file as the runner plans it, one flushed
    line per step (a killed server keeps its trace); no ``path``: nothing."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file: IO[str] | None = None

    @property
    def recording(self) -> bool:
        return self._file is not None

    def start(self, header: dict[str, int]) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("w")
        self._file.write(json.dumps({"version": TRACE_VERSION, **header}) + "\n")
        self._file.flush()

    def record(self, step: StepShape) -> None:
        if self._file is not None:
            self._file.write(step.to_json() + "\n")
            self._file.flush()
