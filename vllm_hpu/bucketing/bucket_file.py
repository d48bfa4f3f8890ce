"""Bucket files (``VLLM_BUCKETING_FROM_FILE``), in the reference Gaudi format: one
``(batch_size, query_len, num_blocks)`` per line, lists for the Cartesian
product (``(1, [256, 512], [0, 4])`` is four); query length 1 makes a decode
bucket; ``#`` comments."""

import ast
import itertools
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from vllm_hpu.bucketing.buckets import Bucket

DECODE_QUERY_LEN = 1
FORMAT_HINT = (
    "each line must be (batch_size, query_len, num_blocks) with integers or "
    "lists of integers, e.g. (1, [256, 512], 0) or (64, 1, 1024)"
)


class BucketSets(NamedTuple):
    prompt: list[Bucket]
    decode: list[Bucket]


def _values(element: object) -> list[int]:
    values = element if isinstance(element, list) else [element]
    if not values or not all(isinstance(v, int) and v >= 0 for v in values):
        raise ValueError(f"not a non-negative integer or list of them: {element!r}")
    return values  # type: ignore[return-value]


def parse_line(line: str) -> list[Bucket]:
    """The buckets one non-comment line names."""
    try:
        item = ast.literal_eval(line)
        if not isinstance(item, tuple) or len(item) != 3:
            raise ValueError("not a 3-tuple")
        dims = [_values(element) for element in item]
    except (ValueError, SyntaxError) as error:
        raise ValueError(f"{line!r}: {error}; {FORMAT_HINT}") from None
    return [Bucket(*values) for values in itertools.product(*dims)]


def parse_buckets(lines: Iterable[str], source: str) -> BucketSets:
    prompt: set[Bucket] = set()
    decode: set[Bucket] = set()
    for number, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            buckets = parse_line(line)
        except ValueError as error:
            raise ValueError(f"{source}, line {number}: {error}") from None
        for bucket in buckets:
            is_decode = bucket.query_len == DECODE_QUERY_LEN
            (decode if is_decode else prompt).add(bucket)
    if not prompt or not decode:
        raise ValueError(
            f"{source} names no {'prompt' if not prompt else 'decode'} bucket: a "
            "bucket file must list both (decode buckets have query_len 1)"
        )
    return BucketSets(sorted(prompt), sorted(decode))


def read_bucket_file(path: str | Path) -> BucketSets:
    """The prompt and decode buckets of a file; a bad file raises, naming the line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(
            f"VLLM_BUCKETING_FROM_FILE={path} does not exist: point it at a bucket "
            "file (python -m vllm_hpu.bucketing --plan-out writes one)"
        )
    return parse_buckets(path.read_text().splitlines(), str(path))


def format_buckets(sets: BucketSets, header: str = "") -> str:
    """A bucket file: one bucket per line, prompt buckets first."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    lines += ["# Prompt: (batch_size, query_len, context_blocks)"]
    lines += [str(tuple(b)) for b in sets.prompt]
    lines += ["# Decode: (batch_size, 1, num_blocks)"]
    lines += [str(tuple(b)) for b in sets.decode]
    return "\n".join(lines) + "\n"


def write_bucket_file(path: str | Path, sets: BucketSets, header: str = "") -> None:
    Path(path).write_text(format_buckets(sets, header))
