"""Test-wide set-up: emulation on, models from the local cache, no hub.

With VLLM_HPU_DOUBLE=1 the run is the HPU-branch lane instead: the test double
of Habana's bridge (tests/hpu_double) goes on the path of this process and of
every process it starts, and the plugin takes its Gaudi branch. The double makes
"hpu" a torch device process-wide, so the lane runs apart from the rest of the
suite (its folder, hpu_double_unit, is collected only there).
"""

import collections
import hashlib
import logging
import os
import pathlib
import sys
import tempfile

import pytest
from hypothesis import HealthCheck, settings

HPU_DOUBLE_LANE = os.environ.get("VLLM_HPU_DOUBLE") == "1"
HPU_DOUBLE = pathlib.Path(__file__).resolve().parent / "hpu_double"
if HPU_DOUBLE_LANE:
    sys.path.insert(0, str(HPU_DOUBLE))
    paths = [str(HPU_DOUBLE), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    os.environ.setdefault("PT_HPU_LAZY_MODE", "0")
    os.environ.setdefault(
        "HPU_DOUBLE_STATE_DIR", tempfile.mkdtemp(prefix="hpu-double-")
    )
else:
    # Emulation must be on before vLLM is imported anywhere (spawned engine
    # processes find the plugin again through its entry point and read this too).
    os.environ.setdefault("VLLM_HPU_EMULATION", "1")
collect_ignore = [] if HPU_DOUBLE_LANE else ["hpu_double_unit"]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# The tests import transformers themselves, before vLLM loads the plugin.
from vllm_hpu.patches.torchvision_import import allow_torchvision_import  # noqa: E402

allow_torchvision_import()


def _share_cores_between_workers() -> None:
    """Under ``pytest -n N`` each worker's torch computes on its share of the
    cores: N thread pools of every core would busy-wait for each other (as the
    engine's own compute threads do, vllm_hpu.device.compute_threads)."""
    import torch

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


_share_cores_between_workers()

# Property tests run beside engine tests on a 2-core CI machine: input generation
# can be slow there through no fault of the strategy, and a deadline measures the
# machine's load, not the code.
settings.register_profile(
    "shared-cpu", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("shared-cpu")

MODELS_DIR = pathlib.Path(__file__).resolve().parent.parent / ".cache" / "models"


class LogRecorder:
    """Records of the ``vllm`` logger tree (the plugin's ``vllm.hpu.*`` included).

    It watches ``Logger.handle`` rather than adding a handler: vLLM configures its
    logging when an engine starts, which drops handlers from the ``vllm`` loggers.
    """

    def __init__(self) -> None:
        self.records: list[logging.LogRecord] = []

    def messages(self, level: int = logging.INFO) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno >= level]

    def take(self, level: int = logging.INFO) -> list[str]:
        """The messages so far, forgetting them."""
        messages = self.messages(level)
        self.records.clear()
        return messages


@pytest.fixture
def vllm_log(monkeypatch):
    recorder = LogRecorder()
    handle = logging.Logger.handle

    def recording_handle(logger: logging.Logger, record: logging.LogRecord) -> None:
        if record.name == "vllm" or record.name.startswith("vllm."):
            recorder.records.append(record)
        handle(logger, record)

    monkeypatch.setattr(logging.Logger, "handle", recording_handle)
    vllm_logger = logging.getLogger("vllm")
    if vllm_logger.getEffectiveLevel() > logging.INFO:
        # vLLM sets INFO when it configures its logging (at engine start); until
        # then INFO records would not even be made.
        vllm_logger.setLevel(logging.INFO)
    return recorder


@pytest.fixture
def hpu_env(monkeypatch):
    """Set plugin variables for one test; the plugin reads them once per process,
    so its cached reading is dropped on set and on teardown."""
    from vllm_hpu import envs

    def apply(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)
        envs.get_envs.cache_clear()

    yield apply
    monkeypatch.undo()
    envs.get_envs.cache_clear()


def xdist_group(item: pytest.Item) -> str:
    """Which tests one ``pytest -n`` worker runs together: those of one shared
    engine or server (it then starts once), Ray's clusters one at a time, and
    otherwise a module's tests (its module-scoped fixtures then run once)."""
    if "ray" in item.name:
        return "ray"
    callspec = getattr(item, "callspec", None)
    for argname in ("shared_engine", "shared_server"):
        spec = callspec.params.get(argname) if callspec else None
        if spec is not None:
            digest = hashlib.sha1(repr(spec).encode()).hexdigest()[:10]
            return f"{argname}-{spec.name}-{digest}"
    return item.nodeid.split("::")[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(xdist_group(item)))


def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """A ``--dist loadgroup`` run must see its groups: pytest-xdist tags a grouped
    test by rewriting its node id, which pytest 9.2 stopped reading, and the
    groups were then ignored without a word (each shared engine started on both
    workers, Ray clusters side by side)."""
    if node.config.getoption("dist") == "loadgroup" and ids and "@" not in ids[0]:
        raise pytest.UsageError(
            "pytest-xdist's --dist loadgroup did not group the tests under "
            f"pytest {pytest.__version__}: install the versions pinned in "
            "requirements-test.txt."
        )


# Seconds each test file took (set-up, call and teardown of its tests, summed
# over the workers), printed after the run: where the suite's time goes.
FILE_SECONDS: collections.Counter[str] = collections.Counter()
FILES_SHOWN = 30


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    FILE_SECONDS[report.nodeid.split("::")[0]] += report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    if not FILE_SECONDS:
        return
    total = sum(FILE_SECONDS.values())
    terminalreporter.section(f"seconds per test file (all workers: {total:.0f} s)")
    for path, seconds in FILE_SECONDS.most_common(FILES_SHOWN):
        terminalreporter.write_line(f"{seconds:8.1f}s {path}")
