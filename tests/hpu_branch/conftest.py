"""The plugin's Gaudi branch, call by call, under the bridge's test double
(VLLM_HPU_DOUBLE=1, tests/conftest.py): each review item of
docs/gaudi-contract-review.md that a call settles (README_GAUDI.md, "How the
Gaudi branch is tested"). This process takes a card; engines and servers, whose
front ends must take none, are tests/e2e/hpu_double's, run by a pytest of their
own (make test-hpu-double)."""

import os

import pytest

if os.environ.get("VLLM_HPU_DOUBLE") != "1":
    raise pytest.UsageError(
        "tests/hpu_branch runs in the test double's lane: "
        "VLLM_HPU_DOUBLE=1 pytest tests/hpu_branch (make test-hpu-double)"
    )


@pytest.fixture
def vllm_config():  # type: ignore[no-untyped-def]
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()) as config:
        yield config
