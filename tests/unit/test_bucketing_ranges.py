"""Range functions: the documented examples, and properties of any range."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_hpu.bucketing.ranges import (
    BucketRange,
    cover_value,
    default_num_points,
    exponential_range,
    linear_range,
    round_beyond,
)


@pytest.mark.parametrize(
    ("bucket_range", "expected"),
    [
        ((2, 32, 64), [2, 4, 8, 16, 32, 64]),
        ((128, 128, 512), [128, 256, 384, 512]),
        ((128, 128, 1024), [128, 256, 384, 512, 640, 768, 896, 1024]),
        ((1, 32, 4), [1, 2, 4]),
        ((1, 128, 4), [1, 2, 4]),
        ((3, 32, 64), [3, 6, 12, 24, 32, 64]),
        ((100, 64, 300), [100, 128, 192, 256, 300]),
        ((128, 128, 1000), [128, 256, 384, 512, 640, 768, 896, 1000]),
        ((0, 8, 31), [0, 1, 2, 4, 8, 16, 24, 31]),
        ((0, 1, 0), [0]),
        ((5, 5, 5), [5]),
    ],
)
def test_linear_range_documented_and_edges(bucket_range, expected):
    assert linear_range(BucketRange(*bucket_range)) == expected


@pytest.mark.parametrize(
    ("bucket_range", "num_points", "expected"),
    [
        ((128, 128, 2048), 10, [128, 256, 384, 512, 640, 896, 1152, 1536, 2048]),
        ((128, 128, 2048), None, [128, 256, 384, 512, 768, 1024, 1536, 2048]),
        ((128, 128, 2048), 1, [2048]),
        ((1, 32, 64), None, [1, 2, 4, 8, 16, 32, 64]),
        ((0, 8, 31), 4, [0, 1, 4, 16, 31]),
    ],
)
def test_exponential_range_examples(bucket_range, num_points, expected):
    assert exponential_range(BucketRange(*bucket_range), num_points) == expected


@pytest.mark.parametrize(
    ("bucket_range", "expected"),
    [((128, 128, 2048), 9), ((1, 32, 64), 13), ((7, 1, 7), 1), ((0, 1, 8), 7)],
)
def test_default_num_points_two_per_doubling(bucket_range, expected):
    assert default_num_points(BucketRange(*bucket_range)) == expected


ranges = (
    st.tuples(st.integers(0, 300), st.integers(1, 300), st.integers(1, 5000))
    .filter(lambda r: r[0] <= r[2])
    .map(lambda r: BucketRange(*r))
)


@given(ranges)
def test_linear_range_sorted_starts_at_min_ends_at_max(bucket_range):
    values = linear_range(bucket_range)
    assert values == sorted(set(values))
    assert values[0] == bucket_range.min
    assert values[-1] == bucket_range.max
    above_step = [
        v for v in values[:-1] if v >= bucket_range.step and v > bucket_range.min
    ]
    assert all(v % bucket_range.step == 0 for v in above_step)


@given(ranges, st.integers(1, 40))
def test_exponential_range_is_linear_subset_with_max(bucket_range, num_points):
    values = exponential_range(bucket_range, num_points)
    assert values == sorted(set(values))
    assert values[-1] == bucket_range.max
    assert set(values) <= set(linear_range(bucket_range))
    assert len(values) <= num_points + 1


@given(ranges, st.integers(0, 6000))
def test_cover_value_is_smallest_covering(bucket_range, needed):
    values = linear_range(bucket_range)
    covered = cover_value(values, needed)
    if needed <= values[-1]:
        assert covered >= needed
        assert all(v < needed for v in values if v < covered)
    else:
        assert covered == values[-1]


@pytest.mark.parametrize(
    ("needed", "expected"), [(36864, 36864), (1025, 1152), (1, 128)]
)
def test_round_beyond_goes_to_next_step_multiple(needed, expected):
    assert round_beyond(needed, BucketRange(128, 128, 1024)) == expected
