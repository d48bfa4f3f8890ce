"""Warm restarts: the compile cache folder's key changes with everything the
compiled graphs depend on, so a changed configuration never loads a stale graph."""

import functools

import pytest
from models import model_path
from vllm.engine.arg_utils import EngineArgs

from vllm_hpu.bucketing import Bucket
from vllm_hpu.worker.compilation import compile_cache
from vllm_hpu.worker.compilation.compile_cache import cache_key

BUCKETS = ([Bucket(1, 32, 0)], [Bucket(1, 1, 2), Bucket(2, 1, 4)])


@functools.cache
def engine_config(**kwargs):
    return EngineArgs(model=model_path("tiny-llama"), **kwargs).create_engine_config()


def key(config=None, buckets=BUCKETS, num_kv_blocks=64, backend="inductor"):
    """The key of tiny-llama in float32 with BUCKETS, unless told otherwise."""
    config = config or engine_config(dtype="float32")
    return cache_key(config, buckets, num_kv_blocks, backend, False)


def test_the_same_configuration_has_the_same_key():
    assert key() == key(engine_config(dtype="float32"))


@pytest.mark.parametrize(
    ("engine", "changed"),
    [
        ({"dtype": "bfloat16"}, {}),
        ({"dtype": "float32", "tensor_parallel_size": 2}, {}),
        ({"dtype": "float32", "max_model_len": 64}, {}),
        ({}, {"buckets": (BUCKETS[0], BUCKETS[1][:1])}),
        ({}, {"buckets": (BUCKETS[0] + [Bucket(1, 64, 0)], BUCKETS[1])}),
        ({}, {"num_kv_blocks": 65}),
        ({}, {"backend": "aot_eager"}),
    ],
    ids=["dtype", "tp", "model-len", "fewer-buckets", "more-buckets", "kv", "backend"],
)
def test_a_changed_configuration_has_another_key(engine, changed):
    config = engine_config(**engine) if engine else None
    assert key(config, **changed) != key()


def test_a_new_plugin_version_has_another_key(monkeypatch):
    before = key()
    monkeypatch.setattr(compile_cache.importlib.metadata, "version", lambda _: "9.9")
    assert key() != before
