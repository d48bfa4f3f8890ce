"""habana_frameworks.torch.core (bridge v1.19.0 core/__init__.py,
core/step_closure.py, core/quantization.py, core/torch_overwrites.py).

Importing it registers ``torch.hpu`` (``torch._register_device_module``) and
wraps the torch functions the bridge wraps that the double needs: the default
device of an "hccl" group, and ``torch.manual_seed``.
"""

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch

from habana_frameworks.torch import hpu
from habana_frameworks.torch._double import habana_torch, native
from habana_frameworks.torch.utils.internal import is_lazy, lazy_only

_step_closures: list[Callable[[], Any]] = []
_closures_lock = threading.Lock()


def _run_step_closures() -> None:
    with _closures_lock:
        closures = list(_step_closures)
        _step_closures.clear()
    for closure in closures:
        closure()


@lazy_only
def mark_step(device_str: str = "", sync: bool = False) -> None:
    """Ends the lazy graph: what was recorded since the last step runs (and is
    compiled the first time this graph is seen)."""
    native.mark_step()
    _run_step_closures()


@lazy_only
def iter_mark_step(device_str: str = "") -> None:
    native.mark_step()
    _run_step_closures()


@lazy_only
def add_step_closure(closure: Callable[..., Any], args: tuple[Any, ...] = ()) -> None:
    with _closures_lock:
        _step_closures.append(lambda: closure(*args))


def _check_model(model: Any) -> None:
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model)}")


def hpu_initialize(
    model: Any = None,
    mark_only_scales_as_const: bool = False,
    optimizer: Any = None,
    args: Any = None,
) -> None:
    """Marks parameters (or only scales) as graph constants in lazy mode; the
    emulated device keeps no constant sections, so only the arguments count."""
    _check_model(model)


def hpu_inference_initialize(
    model: Any = None,
    mark_only_scales_as_const: bool = False,
    optimizer: Any = None,
    args: Any = None,
) -> None:
    _check_model(model)


def hpu_set_env(model: Any = None) -> Any:
    _check_model(model)
    return model


def hpu_set_inference_env(model: Any = None) -> Any:
    _check_model(model)
    return model


def hpu_reset_env() -> None:
    return None


def hpu_teardown_inference_env() -> None:
    return None


def _overwrite_torch_functions() -> None:
    """The bridge's torch_overwrites.py:117-147: an "hccl" group's default
    device is "hpu"; torch.manual_seed seeds the device's generator too."""
    c10d = torch.distributed.distributed_c10d
    default_device = c10d._get_pg_default_device

    @functools.wraps(default_device)
    def pg_default_device(group: Any = None) -> torch.device:
        name = group._get_backend_name() if group is not None else c10d.get_backend()
        if name == "hccl":
            return torch.device("hpu")
        return default_device(group)

    c10d._get_pg_default_device = pg_default_device
    manual_seed = torch.manual_seed

    @functools.wraps(manual_seed)
    def seed_everything(seed: int) -> Any:
        hpu.random.manual_seed(seed)
        return manual_seed(seed)

    torch.manual_seed = seed_everything


torch._register_device_module("hpu", hpu)
_overwrite_torch_functions()
habana_torch.apply()
if not is_lazy():
    import habana_frameworks.torch.dynamo.compile_backend  # noqa: F401
else:
    from habana_frameworks.torch.dynamo.compile_backend import backends  # noqa: F401
