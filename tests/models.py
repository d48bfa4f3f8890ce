"""Where tests find the local models that `make setup` builds under .cache/models.

A missing model fails the test with the command that builds it: no hub fallback.
Plain functions, not fixtures: an imported fixture trips linters (F811).
"""

from pathlib import Path

import pytest
from conftest import MODELS_DIR

TINY_MODELS = (
    "tiny-llama",
    "tiny-qwen2",
    "tiny-qwen3",
    "tiny-mistral",
    "tiny-opt",
    "tiny-gpt2",
)
# Built by the set-up too, but with a classification head: they do not generate.
POOLING_MODELS = ("tiny-llama-classify",)
SMOLLM2 = "smollm2-135m-instruct"


def model_path(name: str) -> str:
    """Path of a built model as a string, as vLLM and transformers take it."""
    path: Path = MODELS_DIR / name
    if not (path / "config.json").is_file():
        pytest.fail(f"{path} is missing: run `make setup` to build the local models")
    return str(path)
