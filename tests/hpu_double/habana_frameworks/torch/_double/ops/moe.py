"""hpu::mixture_of_experts and its overloads: the fused MoE kernel.

Schemas: the default and .fused_weights from bridge v1.19.0
(habana_eager/eager_custom_op_register.cpp:2206-2209), the fp8 overloads, newer,
from a published fork of a later bridge, ankurneog/gaudi-pytorch-bridge@ea38cef
(scripts/hpu_op.yaml; declared in habana_eager/ops/mixture_of_experts.h).
Every scale argument without a default is required: a call that leaves one out
fails at the dispatcher.

For each token, each routed expert e in [experts_min, experts_max] (the local
experts, one list entry each) adds router_weight * down(act(gate(x)) * up(x)).
w1/w2/w3 are gate, up and down; w12 is gate and up concatenated (split in
halves). ``permuted_weights`` means [out, in] (nn.Linear's) layout, else
[in, out]. The fp8 overloads dequantize with the d_scale_* (per tensor or per
output channel; per block of ``block_size`` for _blockwise), quantize the
intermediate activations to fp8 with d_scale_intermediate_hidden_states (per
token at run time for _dynamic), and return bf16.
"""

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from habana_frameworks.torch._double.ops import (
    define,
    fp8_max,
    fp8_values,
    host,
    hosts,
    to_device,
    to_fp8,
)

_HEAD = "Tensor hidden_states, Tensor expert_routing_table, Tensor router_weights"
_SEPARATE = "Tensor[] w1, Tensor[] w2, Tensor[] w3"
_FUSED = "Tensor[] w12, Tensor[] w3"
_TAIL = "bool permuted_weights, str activation, int experts_min, int experts_max"
# The published schemas, spelled out (bridge_signatures.json records where).
SCHEMAS = {
    "": f"({_HEAD}, {_SEPARATE}, {_TAIL}) -> Tensor",
    ".fused_weights": f"({_HEAD}, {_FUSED}, {_TAIL}) -> Tensor",
    ".fp8": f"({_HEAD}, {_SEPARATE}, Tensor d_scale_hidden_states, "
    "Tensor[] d_scale_intermediate_hidden_states, Tensor[] d_scale_w1, "
    f"Tensor[] d_scale_w2, Tensor[] d_scale_w3, {_TAIL}) -> Tensor",
    ".fp8_fused_weights": f"({_HEAD}, {_FUSED}, Tensor d_scale_hidden_states, "
    "Tensor[] d_scale_intermediate_hidden_states, Tensor[] d_scale_w12, "
    f"Tensor[] d_scale_w3, {_TAIL}) -> Tensor",
    ".fp8_scalars": f"({_HEAD}, {_SEPARATE}, float d_scale_hidden_states, "
    "float[] d_scale_intermediate_hidden_states, float[] d_scale_w1, "
    f"float[] d_scale_w2, float[] d_scale_w3, {_TAIL}) -> Tensor",
    ".fp8_fused_weights_scalars": f"({_HEAD}, {_FUSED}, float d_scale_hidden_states, "
    "float[] d_scale_intermediate_hidden_states, float[] d_scale_w12, "
    f"float[] d_scale_w3, {_TAIL}) -> Tensor",
    ".fp8_dynamic": f"({_HEAD}, {_SEPARATE}, Tensor d_scale_hidden_states, "
    "Tensor[] d_scale_w1, Tensor[] d_scale_w2, Tensor[] d_scale_w3, "
    f"{_TAIL}) -> Tensor",
    ".fp8_fused_weights_dynamic": f"({_HEAD}, {_FUSED}, Tensor d_scale_hidden_states, "
    f"Tensor[] d_scale_w12, Tensor[] d_scale_w3, {_TAIL}) -> Tensor",
    ".fp8_scalars_dynamic": f"({_HEAD}, {_SEPARATE}, float d_scale_hidden_states, "
    f"float[] d_scale_w1, float[] d_scale_w2, float[] d_scale_w3, {_TAIL}) -> Tensor",
    ".fp8_fused_weights_scalars_dynamic": f"({_HEAD}, {_FUSED}, "
    "float d_scale_hidden_states, float[] d_scale_w12, float[] d_scale_w3, "
    f"{_TAIL}) -> Tensor",
    ".fp8_blockwise": f"({_HEAD}, {_SEPARATE}, Tensor[] d_scale_w1, "
    f"Tensor[] d_scale_w2, Tensor[] d_scale_w3, int block_size, {_TAIL}) -> Tensor",
    ".fp8_fused_weights_blockwise": f"({_HEAD}, {_FUSED}, Tensor[] d_scale_w12, "
    f"Tensor[] d_scale_w3, int block_size, {_TAIL}) -> Tensor",
}
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "relu": F.relu,
}


def _as_scale(value: Any) -> torch.Tensor | None:
    if value is None:
        return None
    return (
        host(value).float() if isinstance(value, torch.Tensor) else torch.tensor(value)
    )


def _dequantized(
    weight: torch.Tensor, scale: Any, permuted: bool, block: int | None
) -> torch.Tensor:
    values = fp8_values(weight) if weight.dtype.itemsize == 1 else weight.float()
    scale = _as_scale(scale)
    if scale is None or scale.numel() == 1:
        return values if scale is None else values * scale.reshape(())
    if block is not None:
        grid = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)
        return values * grid[: values.shape[0], : values.shape[1]]
    return values * (scale.reshape(-1, 1) if permuted else scale.reshape(1, -1))


def _linear(x: torch.Tensor, weight: torch.Tensor, permuted: bool) -> torch.Tensor:
    return x @ (weight.t() if permuted else weight)


def _requantized(values: torch.Tensor, scale: Any, dynamic: bool) -> torch.Tensor:
    """The intermediate activations as the fp8 kernel sees them."""
    limit = fp8_max(torch.float8_e4m3fn)
    if dynamic:
        scale = values.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / limit
    elif scale is None:
        return values
    else:
        scale = _as_scale(scale).reshape(())
    return fp8_values(to_fp8(values / scale, torch.float8_e4m3fn)) * scale


class _Experts:
    """The local experts' weights and scales on the host."""

    def __init__(
        self,
        weights: dict[str, list[Any]],
        scales: dict[str, list[Any]],
        options: dict[str, Any],
    ):
        self.weights = weights
        self.scales = scales
        self.permuted = options["permuted_weights"]
        self.block = options.get("block_size")
        self.dynamic = options.get("dynamic", False)
        if options["activation"] not in _ACTIVATIONS:
            raise RuntimeError(
                f"mixture_of_experts: unsupported activation {options['activation']}"
            )
        self.activation = _ACTIVATIONS[options["activation"]]

    def _weight(self, name: str, local: int) -> torch.Tensor:
        scale = self.scales.get(name)
        return _dequantized(
            self.weights[name][local],
            scale[local] if scale else None,
            self.permuted,
            self.block,
        )

    def mlp(self, local: int, x: torch.Tensor) -> torch.Tensor:
        if "w12" in self.weights:
            gate, up = _linear(x, self._weight("w12", local), self.permuted).chunk(
                2, dim=-1
            )
        else:
            gate = _linear(x, self._weight("w1", local), self.permuted)
            up = _linear(x, self._weight("w2", local), self.permuted)
        hidden = self.activation(gate) * up
        inter = self.scales.get("intermediate")
        if inter is not None or self.dynamic:
            hidden = _requantized(hidden, inter[local] if inter else None, self.dynamic)
        return _linear(hidden, self._weight("w3", local), self.permuted)


def _route(
    x: torch.Tensor,
    routing: torch.Tensor,
    coefs: torch.Tensor,
    experts: _Experts,
    span: tuple[int, int],
) -> torch.Tensor:
    experts_min, experts_max = span
    out = torch.zeros_like(x)
    for local in range(experts_max - experts_min + 1):
        chosen = routing == experts_min + local
        tokens = chosen.any(dim=-1)
        if bool(tokens.any()):
            weight = (coefs * chosen).sum(dim=-1)[tokens].unsqueeze(-1)
            out[tokens] += weight * experts.mlp(local, x[tokens])
    return out


def _kernel(
    weight_names: tuple[str, ...], fp8_kind: str | None
) -> Callable[..., torch.Tensor]:
    def run(
        hidden_states: torch.Tensor,
        expert_routing_table: torch.Tensor,
        router_weights: torch.Tensor,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        count = len(weight_names)
        weights = {name: hosts(list(args[i])) for i, name in enumerate(weight_names)}
        rest = list(args[count:])
        scales, options = _split_scales(rest, weight_names, fp8_kind)
        experts_min, experts_max = options["experts_min"], options["experts_max"]
        for name, tensors in weights.items():
            if len(tensors) != experts_max - experts_min + 1:
                raise RuntimeError(
                    f"mixture_of_experts: {len(tensors)} {name} weights for "
                    f"experts {experts_min}..{experts_max}"
                )
        x = host(hidden_states)
        x = fp8_values(x) if x.dtype.itemsize == 1 else x.float()
        if scales.get("hidden") is not None:
            x = x * _as_scale(scales["hidden"])
        experts = _Experts(weights, scales, options)
        out = _route(
            x,
            host(expert_routing_table).long(),
            host(router_weights).float(),
            experts,
            (experts_min, experts_max),
        )
        dtype = torch.bfloat16 if fp8_kind else hidden_states.dtype
        return to_device(out.to(dtype))

    return run


def _split_scales(
    rest: list[Any], weight_names: tuple[str, ...], fp8_kind: str | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    scales: dict[str, Any] = {}
    if fp8_kind is not None and fp8_kind != "fp8_blockwise":
        scales["hidden"] = rest.pop(0)
        if "dynamic" not in fp8_kind:
            scales["intermediate"] = list(rest.pop(0))
    if fp8_kind is not None:
        for name in weight_names:
            scales[name] = list(rest.pop(0))
    options: dict[str, Any] = {
        "dynamic": fp8_kind is not None and "dynamic" in fp8_kind
    }
    if fp8_kind == "fp8_blockwise":
        options["block_size"] = rest.pop(0)
    keys = ("permuted_weights", "activation", "experts_min", "experts_max")
    options.update(dict(zip(keys, rest[:4], strict=True)))
    return scales, options


def _fake(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.empty_like(hidden_states)


def _fake_fp8(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.empty_like(hidden_states, dtype=torch.bfloat16)


def register() -> None:
    for overload, schema in SCHEMAS.items():
        fused = "fused_weights" in overload
        names = ("w12", "w3") if fused else ("w1", "w2", "w3")
        kind = overload.lstrip(".").replace("_fused_weights", "") or None
        kind = None if kind == "fused_weights" else kind
        kernel = _kernel(names, kind)
        define(
            f"mixture_of_experts{overload}{schema}",
            kernel,
            _fake_fp8 if kind else _fake,
        )
