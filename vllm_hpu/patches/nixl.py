"""``import nixl`` answered by the nixl-cu12 wheel."""

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any

# Why: vLLM imports ``nixl._api``; the ``nixl-cu12`` wheel (no CUDA needed)
# installs ``nixl_cu12``, and the ``nixl`` meta package needs cu12 and cu13 wheels.
# How: without a real ``nixl``, an import finder answers ``nixl(.*)`` with
# ``nixl_cu12``'s modules, importing nothing until vLLM asks.
# Upstream change that removes it: a ``nixl`` meta package whose CUDA variants are
# extras (or vLLM importing the variant packages itself, as it does for ROCm).
_NIXL = "nixl"
_NIXL_WHEEL = "nixl_cu12"


class _NixlFromWheel(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self) -> None:
        self.wheel_specs: dict[str, Any] = {}

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.partition(".")[0] != _NIXL:
            return None
        finder = importlib.machinery.PathFinder
        if finder.find_spec(_NIXL) is not None or finder.find_spec(_NIXL_WHEEL) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(_NIXL_WHEEL + spec.name[len(_NIXL) :])
        self.wheel_specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # Executed already as nixl_cu12's; it keeps its own spec, not the alias's.
        module.__spec__ = self.wheel_specs.pop(module.__name__)


@functools.cache
def import_nixl_from_wheel() -> None:
    """Idempotent; lets ``import nixl._api`` find the nixl-cu12 wheel."""
    sys.meta_path.insert(0, _NixlFromWheel())
