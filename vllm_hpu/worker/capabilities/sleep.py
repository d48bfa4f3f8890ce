"""Sleep mode (``enable_sleep_mode=True``): give the device back between rollouts.
``sleep(level=1)`` moves weights and buffers to the host and frees the KV cache;
``level=2`` frees both, keeping only buffers (rotary tables: not in
checkpoints) and ``sleep_preserve_parameter_names``. ``wake_up(tags)`` restores
weights and the (empty) KV cache separately. Only storages are swapped (same
shape, strides, dtype), so torch.compile graphs stay valid; HPU graphs (fixed
addresses) are dropped (``device.reset_graphs``) and recorded again."""

import fnmatch
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from vllm.logger import init_logger

from vllm_hpu import device

logger = init_logger("vllm.hpu.sleep")

TAGS = ("weights", "kv_cache")


@dataclass
class _Asleep:
    """A parameter or buffer while the model sleeps."""

    tensor: torch.Tensor  # the model's own tensor, its storage emptied
    shape: torch.Size
    stride: tuple[int, ...]
    host: torch.Tensor | None  # its values on the host; None: dropped (level 2)


def _model_tensors(
    modules: list[torch.nn.Module],
) -> Iterator[tuple[str, torch.Tensor, bool]]:
    """(name, tensor, is_parameter) of every parameter and buffer, each tensor
    once (a tied LM head is the embedding's parameter)."""
    seen: set[int] = set()
    for module in modules:
        tensors: list[tuple[str, torch.Tensor, bool]] = [
            (n, p, True) for n, p in module.named_parameters()
        ]
        tensors += [(n, b, False) for n, b in module.named_buffers()]
        for name, tensor, is_parameter in tensors:
            if id(tensor) not in seen and tensor.numel() > 0:
                seen.add(id(tensor))
                yield name, tensor, is_parameter


class HpuSleepMode:
    """The asleep weights and KV cache of one worker."""

    def __init__(self, preserve_parameter_names: list[str]):
        self.preserve = preserve_parameter_names  # kept on the host at level 2
        self.asleep: set[str] = set()
        self._weights: list[_Asleep] = []

    def sleep(
        self,
        level: int,
        modules: list[torch.nn.Module],
        release_kv_cache: Callable[[], None],
    ) -> None:
        if level not in (1, 2):
            raise ValueError(f"Sleep level {level} does not exist: use 1 or 2.")
        if self.asleep:
            raise RuntimeError(f"Already asleep ({sorted(self.asleep)}).")
        self._weights = [
            self._put_to_sleep(name, tensor, keep=level == 1 or not is_parameter)
            for name, tensor, is_parameter in _model_tensors(modules)
        ]
        release_kv_cache()
        self.asleep = set(TAGS)
        device.release_freed_memory()

    def _put_to_sleep(self, name: str, tensor: torch.Tensor, keep: bool) -> _Asleep:
        preserved = any(fnmatch.fnmatchcase(name, p) for p in self.preserve)
        host = device.to_host(tensor) if keep or preserved else None
        asleep = _Asleep(tensor, tensor.shape, tensor.stride(), host)
        tensor.data = tensor.data.new_empty(0)
        return asleep

    def wake_up(
        self, tags: list[str] | None, restore_kv_cache: Callable[[], None]
    ) -> None:
        wanted = set(TAGS if tags is None else tags)
        unknown = wanted - set(TAGS)
        if unknown:
            raise ValueError(f"Unknown sleep tags {sorted(unknown)}: use {TAGS}.")
        if "weights" in wanted & self.asleep:
            self._wake_weights()
        if "kv_cache" in wanted & self.asleep:
            restore_kv_cache()
        self.asleep -= wanted
        device.synchronize()

    def _wake_weights(self) -> None:
        for asleep in self._weights:
            tensor = asleep.tensor
            awake = torch.empty_strided(
                asleep.shape, asleep.stride, dtype=tensor.dtype, device=tensor.device
            )
            if asleep.host is not None:
                awake.copy_(asleep.host)
            tensor.data = awake
        self._weights = []
        self.asleep.discard("weights")

    def discard(self, tags: tuple[str, ...], release_kv_cache: Callable[[], None]):
        """Free what ``tags`` name (``release_kv_cache_memory``): the KV cache only."""
        if set(tags) - {"kv_cache"}:
            raise ValueError(f"Only the KV cache can be discarded, not {tags}.")
        if "kv_cache" not in self.asleep:
            release_kv_cache()
            self.asleep.add("kv_cache")
            device.release_freed_memory()

    def check_awake(self, action: str) -> None:
        """Weights are loaded into the model's own tensors: they must exist."""
        if "weights" in self.asleep:
            raise RuntimeError(
                f"{action} needs the weights on the device: call "
                "wake_up(tags=['weights']) first."
            )
