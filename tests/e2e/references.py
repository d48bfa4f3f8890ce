"""transformers' greedy references, kept on disk between runs (.cache/hf_reference).

A reference is keyed by everything that decides it: the bytes of the model
directory, the prompts and token count, dtype and attention implementation, the
source of the function computing it, the torch and transformers versions, the
thread count and the CPU kernels torch picked. A kept reference is therefore
what transformers would compute again on this machine, and no change to the
plugin can be hidden by it (transformers never runs the plugin). Delete the
folder to recompute every reference.
"""

import functools
import hashlib
import inspect
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from conftest import MODELS_DIR

CACHE_DIR = MODELS_DIR.parent / "hf_reference"


def cached_tokens(
    compute: Callable[..., list[list[int]]], model_dir: str, **inputs: Any
) -> list[list[int]]:
    """``compute(model_dir, **inputs)``, or its result from an earlier run with
    the same key."""
    key = _key(compute, model_dir, inputs)
    path = CACHE_DIR / f"{hashlib.sha256(key.encode()).hexdigest()}.json"
    if path.is_file():
        return json.loads(path.read_text())["tokens"]
    tokens = compute(model_dir, **inputs)
    _write(path, json.dumps({"key": json.loads(key), "tokens": tokens}))
    return tokens


def _key(compute: Callable[..., Any], model_dir: str, inputs: dict[str, Any]) -> str:
    import transformers

    return json.dumps(
        {
            "model": model_digest(model_dir),
            "inputs": {name: repr(value) for name, value in inputs.items()},
            "code": hashlib.sha256(inspect.getsource(compute).encode()).hexdigest(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "threads": torch.get_num_threads(),
            "cpu": torch.backends.cpu.get_cpu_capability(),
        },
        sort_keys=True,
    )


def model_digest(model_dir: str) -> str:
    """SHA-256 over the directory's files (names and bytes); computed once per
    process for files of unchanged size and modification time."""
    root = Path(model_dir)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    stamp = tuple(
        (str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns)
        for p in files
    )
    return _digest(str(root), stamp)


@functools.cache
def _digest(root: str, stamp: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256()
    for name, _, _ in stamp:
        digest.update(name.encode() + b"\0")
        with open(os.path.join(root, name), "rb") as file:
            while chunk := file.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()


def _write(path: Path, text: str) -> None:
    """Atomically: concurrent runs (helpers share .cache) never read half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        "w", dir=path.parent, suffix=".tmp", delete=False
    ) as file:
        file.write(text)
    os.chmod(file.name, 0o644)
    os.replace(file.name, path)
