"""An optional feature asked for without its package (the test layer's) stops
start-up naming the package, before an engine process would fail on the import."""

import sys

import pytest
from models import model_path


def _engine_config(**kwargs):
    from vllm.engine.arg_utils import EngineArgs

    kwargs.setdefault("dtype", "float32")
    return EngineArgs(model=model_path("tiny-llama"), **kwargs).create_engine_config()


@pytest.mark.parametrize(
    ("module", "options", "named"),
    [
        (
            "neural_compressor",
            {"quantization": "inc", "dtype": "bfloat16"},
            "pip install neural-compressor-pt==",
        ),
        (
            "numba",
            {
                "speculative_config": {
                    "method": "ngram",
                    "num_speculative_tokens": 2,
                    "prompt_lookup_max": 2,
                }
            },
            "pip install numba==",
        ),
    ],
)
def test_missing_optional_package_is_named(monkeypatch, module, options, named):
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    with pytest.raises(ValueError, match=named):
        _engine_config(**options)
