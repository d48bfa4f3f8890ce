"""The bridge's custom operators (``torch.ops.hpu.*``), with the published
schemas (recorded in bridge_signatures.json) and CPU semantics.

Each operator has a kernel for the HPU dispatch key only, as on a Gaudi: called
with CPU tensors it fails as torch does for an operator a backend lacks. The
kernels compute on host views of the HPU tensors (``hpu_double::host_view``)
and hand results back as HPU tensors (``hpu_double::adopt``); a fake kernel lets
torch.compile trace them.
"""

from collections.abc import Callable
from typing import Any

import torch

from habana_frameworks.torch._double import native
from habana_frameworks.torch._double.config import config

LIBRARY = torch.library.Library("hpu", "DEF")

# The e4m3 byte pattern of the top exponent: Gaudi2 reads it as Inf/NaN.
_TOP_EXPONENT = 0x78
_NAN_BYTE = 0x7F


def define(schema: str, kernel: Callable[..., Any], fake: Callable[..., Any]) -> None:
    """Defines ``hpu::<schema>`` with its HPU kernel and its fake kernel."""
    LIBRARY.define(schema)
    name = schema.split("(", 1)[0]
    LIBRARY.impl(name, _counted(name, kernel), "HPU")
    torch.library.register_fake(f"hpu::{name}", fake, lib=LIBRARY)


def _counted(name: str, kernel: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        native.note_operator(f"hpu::{name}")
        return kernel(*args, **kwargs)

    return run


def host(t: torch.Tensor | None) -> torch.Tensor | None:
    """The host view of an HPU tensor (no copy); CPU scale tensors with one
    element pass as the bridge's host-to-device scales do."""
    if t is None:
        return None
    if t.device.type == "hpu":
        return torch.ops.hpu_double.host_view(t)
    if t.numel() > 1:
        raise RuntimeError(
            "Expected all tensors to be on the same device, but found at least two "
            "devices, hpu:0 and cpu!"
        )
    return t


def hosts(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [host(t) for t in tensors]  # type: ignore[misc]


def to_device(t: torch.Tensor) -> torch.Tensor:
    return torch.ops.hpu_double.adopt(t)


def e4m3_max() -> float:
    return config().generation.fp8_e4m3_max


def fp8_max(dtype: torch.dtype) -> float:
    """The largest finite value of ``dtype`` on this card generation."""
    if dtype == torch.float8_e4m3fn:
        return e4m3_max()
    return float(torch.finfo(dtype).max)


def fp8_values(t: torch.Tensor) -> torch.Tensor:
    """The float32 values of fp8 data as the card computes with them: on Gaudi2
    e4m3 bytes with the top exponent (256..448 in OCP e4m3fn) read as NaN."""
    if t.dtype == torch.float8_e4m3fn and e4m3_max() < 448.0:
        raw = t.contiguous().view(torch.uint8)
        top = (raw & _TOP_EXPONENT) == _TOP_EXPONENT
        raw = torch.where(top, torch.full_like(raw, _NAN_BYTE), raw)
        t = raw.view(torch.float8_e4m3fn)
    return t.float()


def to_fp8(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The card's conversion to fp8: saturating at its largest value."""
    limit = fp8_max(dtype)
    return values.clamp(-limit, limit).to(dtype)


def register_all() -> None:
    from habana_frameworks.torch._double.ops import attention, fp8, moe, norm, rotary

    for module in (attention, fp8, moe, norm, rotary):
        module.register()
