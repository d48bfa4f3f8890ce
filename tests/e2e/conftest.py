"""Shared engines and servers for end-to-end tests (tests/e2e/harness.py,
tests/e2e/server.py).

``shared_engine`` and ``shared_server`` are session-scoped and parametrized by
a spec (through ``uses_engines`` / ``uses_servers``), so that pytest orders
the tests of each spec one after another across modules; the pools start each
spec's engine or server once, and stop it after the last test using it.
"""

import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.harness import ENGINE_POOL, EngineSpec, plugin_env
from e2e.server import SERVER_POOL, ServerSpec

POOLS = {"shared_engine": ENGINE_POOL, "shared_server": SERVER_POOL}
HERE = pathlib.Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every end-to-end test is ``slow`` (it starts an engine, a server or a
    process), whether or not its module says so: make test-fast leaves it out
    unless it is also marked ``smoke``."""
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def shared_engine(request: pytest.FixtureRequest) -> EngineSpec:
    return request.param


@pytest.fixture(scope="session")
def shared_server(request: pytest.FixtureRequest) -> ServerSpec:
    return request.param


@pytest.fixture
def llm(shared_engine: EngineSpec) -> Iterator[Any]:
    """The spec's shared engine with an empty prefix cache and the spec's
    plugin variables set for the test (as while it started: also for the
    reset, a call to the engine like any other)."""
    engine = ENGINE_POOL.get(shared_engine)
    with plugin_env(shared_engine.env):
        assert engine.reset_prefix_cache(), "a request was left running"
        yield engine


@pytest.fixture
def server_url(shared_server: ServerSpec) -> str:
    """The base URL of the spec's shared server."""
    return SERVER_POOL.get(shared_server)


def _spec(item: pytest.Item | None, argname: str) -> Any:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get(argname) if callspec else None


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop a shared engine or server once the next test does not use it."""
    for argname, pool in POOLS.items():
        spec = _spec(item, argname)
        if spec is not None and _spec(nextitem, argname) != spec:
            pool.release()


def pytest_sessionfinish() -> None:
    for pool in POOLS.values():
        pool.release()
