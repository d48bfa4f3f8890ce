"""``import torchvision`` beside a torch its PyPI wheel was not built for."""

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import pathlib
import sys
from typing import Any

# Why: transformers imports torchvision whenever installed, and PyPI's torchvision
# 0.28 is built for CUDA torch: beside ``torch 2.13.0+cpu`` its ``_C`` does not
# load and ``_meta_registrations.py`` fails ("torchvision::nms does not exist").
# How: before its first import, load the extension as torchvision does; only if
# that fails, define nms/qnms schemas without kernels (transforms work, detection
# ops do not). On Gaudi the extension loads.
# Upstream change that removes it: a CPU torchvision wheel on PyPI, or torchvision
# guarding those registrations like its other ops'.
_TORCHVISION_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor",
)
_torchvision_library: list[Any] = []


def _torchvision_extension() -> pathlib.Path | None:
    # The path finder alone: the import hook below calls in here.
    spec = importlib.machinery.PathFinder.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return None
    package = pathlib.Path(next(iter(spec.submodule_search_locations)))
    return next(package.glob("_C*.so"), None)


@functools.cache
def allow_torchvision_import() -> None:
    """Idempotent; makes ``import torchvision`` work beside a torch it was not built
    for (see above). Call before anything imports transformers' image code."""
    extension = _torchvision_extension()
    if extension is None or "torchvision" in sys.modules:
        return
    import torch

    try:
        torch.ops.load_library(str(extension))
    except (OSError, RuntimeError):
        library = torch.library.Library("torchvision", "DEF")
        for schema in _TORCHVISION_SCHEMAS:
            library.define(schema)
        _torchvision_library.append(library)


# Imported at interpreter start by the ``.pth`` file (transformers may reach
# torchvision before any plugin code): only a finder; torch loads with torchvision.
class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    """Runs ``allow_torchvision_import`` before torchvision's first import."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            allow_torchvision_import()
        return None  # the usual finders import it


def install() -> None:
    """Idempotent."""
    if not any(isinstance(f, _BeforeTorchvision) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTorchvision())


install()
