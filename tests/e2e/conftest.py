"""Shared engines for end-to-end tests (see tests/e2e/harness.py).

``shared_engine`` is session-scoped and parametrized by an :class:`EngineSpec`
(through ``uses_engines``): pytest then orders the tests of each spec one after
another across modules, and the engine pool starts each spec's engine once.
"""

from collections.abc import Iterator
from typing import Any

import pytest

from e2e.harness import ENGINE_POOL, EngineSpec, plugin_env


@pytest.fixture(scope="session")
def shared_engine(request: pytest.FixtureRequest) -> Iterator[EngineSpec]:
    spec: EngineSpec = request.param
    yield spec
    # The next spec's tests come next (or the session ends): this engine is done.
    ENGINE_POOL.release()


@pytest.fixture
def llm(shared_engine: EngineSpec) -> Iterator[Any]:
    """The spec's shared engine with an empty prefix cache and the spec's
    plugin variables set for the test."""
    engine = ENGINE_POOL.get(shared_engine)
    assert engine.reset_prefix_cache(), "a request was left running"
    with plugin_env(shared_engine.env):
        yield engine
