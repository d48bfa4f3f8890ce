"""The device's random-number generator (bridge v1.19.0 hpu/random.py).

The emulated device computes on the host, so its generator is the host's
default generator: seeding either seeds what HPU operators draw from.
"""

from collections.abc import Iterable
from typing import Any

import torch

from habana_frameworks.torch.hpu._utils import _get_device_index

__all__ = [
    "get_rng_state",
    "get_rng_state_all",
    "initial_seed",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "set_rng_state",
    "set_rng_state_all",
]

default_generators: list[torch.Generator] = [torch.default_generator]


def _default_generator() -> torch.Generator:
    return default_generators[0]


def get_rng_state(device: Any = "hpu") -> torch.Tensor:
    if _get_device_index(device, optional=True) != 0:
        raise RuntimeError("hpu get_rng_state supports only device 0")
    return _default_generator().get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "hpu") -> None:
    if _get_device_index(device, optional=True) != 0:
        raise RuntimeError("hpu set_rng_state supports only device 0")
    _default_generator().set_state(new_state)


def manual_seed(seed: int) -> torch.Generator:
    return _default_generator().manual_seed(int(seed))


def seed() -> int:
    return _default_generator().seed()


def initial_seed() -> int:
    return _default_generator().initial_seed()


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(0)]


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    states = list(new_states)
    if len(states) != 1:
        raise RuntimeError("hpu set_rng_state_all supports only states len of 1")
    set_rng_state(states[0], 0)


def manual_seed_all(seed: int) -> None:
    manual_seed(seed)


def seed_all() -> None:
    _default_generator().seed()
