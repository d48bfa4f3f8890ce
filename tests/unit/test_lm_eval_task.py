"""The local lm-eval task ``simple_facts`` (benchmarks/inc_accuracy.py) loads
through lm-eval's TaskManager offline, and its data file is what its generator
writes."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TASK_DIR = REPO / "tests" / "data" / "lm_eval"


def _generator():  # type: ignore[no-untyped-def]
    path = TASK_DIR / "make_simple_facts.py"
    spec = importlib.util.spec_from_file_location("make_simple_facts", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shipped_items_are_the_generators_output(tmp_path):
    count = _generator().write(tmp_path / "items.jsonl")
    shipped = (TASK_DIR / "simple_facts.jsonl").read_text()
    assert (tmp_path / "items.jsonl").read_text() == shipped
    assert count == len(shipped.splitlines())


def test_task_loads_offline_with_four_distinct_choices(monkeypatch):
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(REPO)  # the task's data path is relative to the repository
    manager = TaskManager(include_path=str(TASK_DIR), include_defaults=False)
    task = manager.load(["simple_facts"])["tasks"]["simple_facts"]
    docs = list(task.test_docs())
    assert len(docs) >= 100
    for doc in docs:
        choices = task.doc_to_choice(doc)
        assert len(set(choices)) == 4, doc
        assert task.doc_to_text(doc) == f"Question: {doc['question']}\nAnswer:"
        assert choices[task.doc_to_target(doc)] == doc["choices"][doc["answer"]]
