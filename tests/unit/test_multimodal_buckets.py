"""Encoder passes are bucketed by items per pass: powers of two up to the most
items vLLM schedules in one step."""

import pytest

from vllm_hpu.worker.multimodal import encoder_batch_sizes


@pytest.mark.parametrize(
    ("max_items", "expected"),
    [(1, [1]), (2, [1, 2]), (5, [1, 2, 4, 5]), (8, [1, 2, 4, 8])],
)
def test_encoder_batch_sizes(max_items: int, expected: list[int]) -> None:
    assert encoder_batch_sizes(max_items) == expected
