"""Routed experts as INC measures and quantizes them: Gaudi reference class names,
one ``MoeMatmul`` per expert projection, so each expert has its own scale and
files name ``<layer>.moe_op.w13_list.<expert>`` as on Gaudi. The experts are
views of the layer's stacked weights, which QUANTIZE drops before INC converts."""

import re
from collections import Counter
from typing import cast

import torch
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.layers.linear import LinearBase

from vllm_hpu.ops.moe import fused_experts

LAYER_NUMBER = re.compile(r"\.\d+\.")


class MoeMatmul(torch.nn.Module):
    """One expert's projection; ``weight``: [out, in], a view of the layer's (a
    buffer: an expert INC leaves in bf16 moves with the model)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ cast(torch.Tensor, self.weight).t()


class VllmMixtureOfExpertsOp(torch.nn.Module):
    """One layer's routed experts, called as Gaudi's fused MoE op; INC replaces it,
    and unpatched (blocklisted) it runs bf16 experts as the unquantized method."""

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor) -> None:
        super().__init__()
        self.num_experts = w13.shape[0]
        self.experts_min, self.experts_max = 0, self.num_experts - 1
        self.w13_list = torch.nn.ModuleList(MoeMatmul(w) for w in w13.unbind(0))
        self.w2_list = torch.nn.ModuleList(MoeMatmul(w) for w in w2.unbind(0))

    def forward(
        self,
        hidden_states: torch.Tensor,
        expert_routing_table: torch.Tensor,
        router_weights: torch.Tensor,
        permuted_weights: bool = True,
        activation: str = "silu",
    ) -> torch.Tensor:
        """hidden_states: [num_tokens, hidden_size]; expert_routing_table,
        router_weights: [num_tokens, top_k]; weights in [out, in] layout."""
        w13, w2 = _stacked(self.w13_list), _stacked(self.w2_list)
        return fused_experts(
            hidden_states, w13, w2, router_weights, expert_routing_table, activation
        )


def _stacked(experts: torch.nn.ModuleList) -> torch.Tensor:
    return torch.stack([cast(torch.Tensor, expert.weight) for expert in experts])


def attach_moe_ops(model: torch.nn.Module, detach: bool) -> None:
    """Give every MoE layer the ``moe_op`` its method runs while INC is on. With
    ``detach`` (before INC's convert) the layer drops its stacked weights, which the
    experts' views keep where they were loaded: INC moves and converts one expert at
    a time, and its closing ``model.to`` moves no whole bf16 stack to the card."""
    for module in model.modules():
        if isinstance(module, RoutedExperts):
            w13 = cast(torch.Tensor, module.w13_weight).data
            w2 = cast(torch.Tensor, module.w2_weight).data
            module.moe_op = VllmMixtureOfExpertsOp(w13, w2)
            for name in ("w13_weight", "w2_weight") if detach else ():
                empty = torch.nn.Parameter(w13.new_empty(0), requires_grad=False)
                setattr(module, name, empty)


def layers_inc_cannot_take(model: torch.nn.Module, table: dict) -> str:
    """Linear layers INC has no module for (MoE routers) by layer; '' if none."""
    names = [
        f"{LAYER_NUMBER.sub('.*.', name)} ({type(module).__name__})"
        for name, module in model.named_modules()
        if isinstance(module, LinearBase) and type(module).__name__ not in table
    ]
    return ", ".join(f"{name} x{n}" for name, n in Counter(names).items())
