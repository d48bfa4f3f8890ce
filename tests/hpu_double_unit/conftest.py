"""The lane of the bridge's test double (tests/hpu_double): VLLM_HPU_DOUBLE=1
puts the double on the path (tests/conftest.py); these tests check the double
itself against the published bridge and the behaviours it models.
"""

import os

import pytest

if os.environ.get("VLLM_HPU_DOUBLE") != "1":
    raise pytest.UsageError(
        "tests/hpu_double_unit runs in the test double's lane, apart from the "
        "suite: VLLM_HPU_DOUBLE=1 pytest tests/hpu_double_unit"
    )


@pytest.fixture(scope="session")
def bridge():
    """The double, imported into this process (eager mode, Gaudi2, 8 cards)."""
    import habana_frameworks.torch as bridge

    return bridge
