"""An engine process's exit skips the collection of its heap and is not cut
short by a second stop signal (hpu_worker.py)."""

import gc
import signal

import pytest

from vllm_hpu.worker import hpu_worker


@pytest.mark.parametrize(
    ("parent", "registered", "ignored"),
    [(object(), [gc.freeze], True), (None, [], False)],
    ids=["engine-process", "callers-process"],
)
def test_quick_exit_only_in_processes_vllm_started(
    monkeypatch, parent, registered, ignored
):
    at_exit, handlers = [], {}
    monkeypatch.setattr(hpu_worker.multiprocessing, "parent_process", lambda: parent)
    monkeypatch.setattr(hpu_worker.atexit, "register", at_exit.append)
    monkeypatch.setattr(hpu_worker.signal, "signal", handlers.__setitem__)
    hpu_worker._exit_quickly()
    assert at_exit == registered
    expected = dict.fromkeys((signal.SIGINT, signal.SIGTERM), signal.SIG_IGN)
    assert handlers == (expected if ignored else {})
