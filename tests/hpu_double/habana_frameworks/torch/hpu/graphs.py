"""HPU graphs (bridge v1.19.0 hpu/graphs.py): ``wrap_in_hpu_graph`` and the
capture/replay cache behind it.

``wrap_in_hpu_graph(module, ...)`` replaces ``module.forward`` in place and
returns the same module (graphs.py:702-753). Each call's (args, kwargs) are
hashed (graphs.py:488-499: tensors by shape and view, other values by their own
hash, which is identity for plain objects); the first call with a new hash
captures a graph, later ones copy their inputs into the capture-time inputs,
replay, and return the capture-time outputs. ``bypass_hpu_graphs=True`` runs
the original forward; ``warmup_mode=True`` returns the cached outputs without
replaying; ``max_graphs`` caps the cache, past which calls run eagerly.
What a replay reads is described in _double/capture.py.
"""

import collections
import functools
import os
from collections.abc import Callable
from typing import Any

import torch

from habana_frameworks.torch._double import capture, native

__all__ = ["HPUGraph", "wrap_in_hpu_graph", "wrap_in_hpu_graph_func"]


class HPUGraph:
    """One captured graph (graphs.py:42-139)."""

    def __init__(self) -> None:
        self._recording: capture.Recording | None = None
        self._operators: list[Any] = []

    def capture_begin(self, dry_run: bool = False) -> None:
        native.mark_step()
        native.set_capturing(True)
        native.pause_counting(True)
        self._recording = capture.Recording()
        self._recording.__enter__()

    def capture_end(self) -> None:
        recording = self._recording
        assert recording is not None, "capture_end without capture_begin"
        recording.__exit__(None, None, None)
        native.pause_counting(False)
        native.set_capturing(False)
        native.count_compilation()
        self._operators = recording.operators
        self._recording = None

    def replay(self, asynchronous: bool = False) -> None:
        capture.replay(self._operators)

    def replayV3(self, tlistI: list[torch.Tensor], asynchronous: bool = False) -> None:
        capture.replay(self._operators)

    def reset(self) -> None:
        self._operators = []


def _view_hash(tensor: torch.Tensor) -> int:
    """Stands for ``_hpu_C.get_view_hash``: the tensor's view geometry."""
    return hash((tuple(tensor.stride()), tensor.storage_offset()))


def input_hash(obj: Any) -> int:
    from habana_frameworks.torch.hpu import is_autocast_hpu_enabled

    autocast = is_autocast_hpu_enabled()
    if isinstance(obj, dict):
        return input_hash(tuple(obj.items()))
    if isinstance(obj, list) or (
        isinstance(obj, tuple) and not isinstance(obj, torch.Size)
    ):
        return hash((tuple(input_hash(item) for item in obj), autocast))
    if torch.is_tensor(obj):
        return hash((obj.shape, _view_hash(obj), autocast))
    if isinstance(obj, collections.UserDict):
        return hash(tuple((key, tuple(value)) for key, value in obj.items()))
    return hash((obj, autocast))


def copy_to(dst: Any, src: Any) -> None:
    assert type(dst) is type(src)
    if isinstance(dst, dict):
        for (dst_key, dst_value), (src_key, src_value) in zip(
            dst.items(), src.items(), strict=False
        ):
            assert dst_key == src_key
            copy_to(dst_value, src_value)
    elif isinstance(dst, list) or (
        isinstance(dst, tuple) and not isinstance(dst, torch.Size)
    ):
        for dst_item, src_item in zip(dst, src, strict=False):
            copy_to(dst_item, src_item)
    elif torch.is_tensor(dst):
        dst.copy_(src, non_blocking=True)


class _Cached:
    def __init__(self, inputs: Any, outputs: Any, graph: HPUGraph) -> None:
        self.graph_inputs = inputs
        self.graph_outputs = outputs
        self.graph = graph


def _capture(
    cache: dict[int, _Cached],
    key: int,
    orig_fwd: Callable[..., Any],
    args: Any,
    kwargs: Any,
) -> Any:
    graph = HPUGraph()
    graph.capture_begin()
    try:
        outputs = orig_fwd(*args, **kwargs)
    finally:
        graph.capture_end()
    cache[key] = _Cached((args, kwargs), outputs, graph)
    return outputs


def wrapped_hpugraph_forward(
    cache: dict[int, _Cached],
    stream: Any,
    orig_fwd: Callable[..., Any],
    args: Any,
    kwargs: dict[str, Any],
    disable_tensor_cache: bool,
    asynchronous: bool,
    dry_run: bool,
    max_graphs: int | None,
) -> Any:
    warmup_mode = kwargs.pop("warmup_mode", False)
    if kwargs.pop("bypass_hpu_graphs", False):
        return orig_fwd(*args, **kwargs)
    key = input_hash((args, kwargs))
    cached = cache.get(key)
    kwargs.pop("cache_tensors_list", None)
    if cached is None:
        if max_graphs is not None and len(cache) == max_graphs:
            return orig_fwd(*args, **kwargs)
        return _capture(cache, key, orig_fwd, args, kwargs)
    if warmup_mode:
        native.mark_step()
        return cached.graph_outputs
    copy_to(cached.graph_inputs, (args, kwargs))
    cached.graph.replay(asynchronous)
    return cached.graph_outputs


def wrap_in_hpu_graph_func(
    func: Callable[..., Any],
    asynchronous: bool = False,
    disable_tensor_cache: bool = False,
    dry_run: bool = False,
    max_graphs: int | None = None,
) -> Callable[..., Any]:
    cache: dict[int, _Cached] = {}

    def forward(*args: Any, **kwargs: Any) -> Any:
        return wrapped_hpugraph_forward(
            cache,
            None,
            func,
            args,
            kwargs,
            disable_tensor_cache,
            asynchronous,
            dry_run,
            max_graphs,
        )

    return forward


def wrap_in_hpu_graph(
    module: torch.nn.Module,
    asynchronous: bool = False,
    disable_tensor_cache: bool = False,
    dry_run: bool = False,
    max_graphs: int | None = None,
) -> torch.nn.Module:
    cache: dict[int, _Cached] = {}
    orig_fwd = module.forward
    env_cache = os.environ.get("PT_HPUGRAPH_DISABLE_TENSOR_CACHE")
    disable = disable_tensor_cache if env_cache is None else env_cache == "1"

    @functools.wraps(orig_fwd)
    def forward(*args: Any, **kwargs: Any) -> Any:
        return wrapped_hpugraph_forward(
            cache,
            None,
            orig_fwd,
            args,
            kwargs,
            disable,
            asynchronous,
            dry_run,
            max_graphs,
        )

    def clear_cache() -> None:
        cache.clear()

    def clear_inputs() -> None:
        return None

    module.forward = forward  # type: ignore[method-assign]
    module.clear_cache = clear_cache  # type: ignore[assignment]
    module.clear_inputs = clear_inputs  # type: ignore[assignment]
    return module
