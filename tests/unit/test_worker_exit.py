"""An engine process's exit skips the collection of its heap (hpu_worker.py)."""

import gc

import pytest

from vllm_hpu.worker import hpu_worker


@pytest.mark.parametrize(
    ("parent", "registered"),
    [(object(), [gc.freeze]), (None, [])],
    ids=["engine-process", "callers-process"],
)
def test_heap_frozen_at_exit_only_in_processes_vllm_started(
    monkeypatch, parent, registered
):
    at_exit = []
    monkeypatch.setattr(hpu_worker.multiprocessing, "parent_process", lambda: parent)
    monkeypatch.setattr(hpu_worker.atexit, "register", at_exit.append)
    hpu_worker._skip_collection_at_exit()
    assert at_exit == registered
