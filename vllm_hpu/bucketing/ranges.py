"""The values one bucket dimension takes, from a ``(min, step, max)`` triple: pure
integer functions, linear with a doubling ramp-up, and exponential spacing."""

import bisect
import math
from typing import NamedTuple

# Exponential spacing puts this many points in every doubling of the range, so
# the worst-case padding between neighbours is about 1 - 2 ** (-1 / 2) = 29 %.
POINTS_PER_OCTAVE = 2


class BucketRange(NamedTuple):
    """One dimension's resolved ``(min, step, max)``, as the logs print it."""

    min: int
    step: int
    max: int


def linear_range(bucket_range: BucketRange) -> list[int]:
    """``min, 2*min, 4*min, ...`` below ``step``, then multiples of ``step``; ``max``
    always last. A ``min`` of 0 adds 0 and the ramp starts at 1."""
    low, step, high = bucket_range
    values = [0] if low == 0 else []
    value = max(low, 1)
    while value < high:
        values.append(value)
        value = value * 2 if value * 2 < step else (value // step + 1) * step
    values.append(high)
    return sorted(set(values))


def default_num_points(bucket_range: BucketRange) -> int:
    """Points an exponential range gets: ``POINTS_PER_OCTAVE`` per doubling."""
    low, _, high = bucket_range
    if high <= max(low, 1):
        return 1
    return POINTS_PER_OCTAVE * math.ceil(math.log2(high / max(low, 1))) + 1


def exponential_range(
    bucket_range: BucketRange, num_points: int | None = None
) -> list[int]:
    """``num_points`` geometric points from ``min`` to ``max``, each rounded up to a
    value of :func:`linear_range`; duplicates go and ``max`` stays last."""
    linear = linear_range(bucket_range)
    points = num_points if num_points is not None else default_num_points(bucket_range)
    low, _, high = bucket_range
    start = max(low, 1)
    values = {0} if low == 0 else set()
    for i in range(points):
        fraction = i / (points - 1) if points > 1 else 1.0
        point = start * (high / start) ** fraction
        values.add(cover_value(linear, math.ceil(point - 1e-9)))
    values.add(high)
    return sorted(values)


def geometric_range(low: int, step: int, high: int, num_points: int) -> list[int]:
    """``num_points`` geometric points from ``low`` (from ``step`` when ``low`` is 0 or
    1, kept itself) to ``high``, rounded up to multiples of ``step``, capped at
    ``high``; a point within round-off of a multiple stays on it. ``(128, 128,
    2048, 10)`` -> 128, 256, 384, 512, 640, 896, 1152, 1536, 2048."""
    if num_points < 1 or step < 1 or low > high:
        raise ValueError(f"invalid geometric range {(low, step, high, num_points)}")
    if num_points == 1:
        return [high]
    values = {low} if low in (0, 1) else set()
    start = step if low in (0, 1) else low
    for i in range(num_points):
        point = start * (high / start) ** (i / (num_points - 1))
        values.add(math.ceil(point / step - 1e-9) * step)
    ordered = sorted(values)
    ordered[-1] = min(ordered[-1], high)
    return sorted(set(ordered))


def points_per_doubling(high: int) -> int:
    """One point per doubling of ``high``, plus one."""
    return math.ceil(math.log2(max(high, 2))) + 1


def cover_value(values: list[int], needed: int) -> int:
    """The smallest of the sorted ``values`` that is >= ``needed`` (last if none)."""
    index = bisect.bisect_left(values, needed)
    return values[min(index, len(values) - 1)]


def round_beyond(needed: int, bucket_range: BucketRange) -> int:
    """A value past ``max`` for a shape beyond the range: next ``step`` multiple."""
    step = bucket_range.step
    return math.ceil(needed / step) * step
