"""CPU emulation set-up only: ``import torchvision`` works in any process of the venv.

PyPI's torchvision is built for CUDA torch (``patches.py``, patch 3). The plugin
fixes that when vLLM loads it, but a process that imports transformers first (a
reference run, a user's script) reaches torchvision before any plugin code. The
set-up's ``.pth`` file imports this module at interpreter start: it only installs
a finder, and imports torch only once torchvision itself is being imported.
"""

import importlib.abc
import sys
from typing import Any


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    """Runs ``patches.allow_torchvision_import`` before torchvision's first import."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            from vllm_hpu.patches import allow_torchvision_import

            allow_torchvision_import()
        return None  # the usual finders import it


def install() -> None:
    """Idempotent."""
    if not any(isinstance(f, _BeforeTorchvision) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTorchvision())


install()
