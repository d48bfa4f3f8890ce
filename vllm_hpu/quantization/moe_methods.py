"""The plugin's MoE methods as loaded models use them: the base of the quantized
ones (quantization/fp8_moe.py, packed_moe.py: vLLM's method of the format keeps
its weights and loaders, the plugin routes and runs the experts with
ops/fused_moe.py and ops/moe.py), and the load-time check that every MoE layer
runs on one of the plugin's methods as its model asks."""

import abc
from typing import Any, cast

import torch
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.layers.fused_moe.router.fused_moe_router import (
    FusedMoERouter,
)
from vllm.model_executor.layers.fused_moe.router.routing_simulator_router import (
    RoutingSimulatorRouter,
)
from vllm.model_executor.layers.fused_moe.router.zero_expert_router import (
    ZeroExpertRouter,
)
from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

from vllm_hpu.ops.fused_moe import (
    SCORING_FUNCS,
    HpuUnquantizedFusedMoEMethod,
    expert_extras,
    refuse,
    route,
)
from vllm_hpu.ops.moe import ExpertExtras, fused_experts, weights_on_input

# Dequantized bytes of one group of quantized experts in a forward: bounds the
# transient copy (DeepSeek-V3's 256 experts would be 22 GiB in bf16 at once).
EXPERT_GROUP_BYTES = 1 << 30


class HpuQuantizedMoE(abc.ABC):
    """The plugin's quantized experts, a mixin ahead of the vLLM MoE method of the
    format: vLLM's ``create_weights`` stays (the checkpoint's tensors and their
    loaders), its kernels do not. Weights stay packed in device memory; each
    forward routes from the router logits and dequantizes the experts group by
    group (at most ``EXPERT_GROUP_BYTES`` at once) for ops/moe.py."""

    @property
    def is_monolithic(self) -> bool:
        return True

    def get_fused_moe_quant_config(self, layer: Any) -> Any:
        return None  # vLLM's kernels' description: no kernel of vLLM runs

    def process_weights_after_loading(self, layer: Any) -> None:  # noqa: B027
        """Instead of vLLM's repacking for its kernels: the weights are used as
        loaded (a format may normalise its scales)."""

    @abc.abstractmethod
    def dequantize(
        self, layer: Any, experts: slice, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """w13 [n, 2 * intermediate, hidden] and w2 [n, hidden, intermediate] of
        the ``experts`` slice, in ``dtype``."""

    def prepare_input(self, layer: Any, x: torch.Tensor) -> torch.Tensor:
        """The experts' input as the format computes with it (as is by default)."""
        return x

    def extras(self, layer: Any) -> ExpertExtras:
        """The layer's expert extras as the format computes with them."""
        return expert_extras(layer)

    def apply_monolithic(
        self,
        layer: Any,
        x: torch.Tensor,
        router_logits: torch.Tensor,
        input_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: [num_tokens, hidden_size]; router_logits: [num_tokens, num_experts]."""
        topk_weights, topk_ids = route(layer, x, router_logits)
        if layer.apply_router_weight_on_input:  # Llama 4 (top-1)
            x, topk_weights = weights_on_input(x, topk_weights)
        return self.run_experts(layer, x, topk_weights, topk_ids)

    def run_experts(
        self,
        layer: Any,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
    ) -> torch.Tensor:
        num_experts = layer.local_num_experts
        per_group = experts_per_group(layer, x.dtype)
        inputs = self.prepare_input(layer, x)
        extras = self.extras(layer)
        out = None
        for first in range(0, num_experts, per_group):
            experts = slice(first, min(first + per_group, num_experts))
            w13, w2 = self.dequantize(layer, experts, x.dtype)
            part = fused_experts(
                inputs, w13, w2, topk_weights, topk_ids, layer.activation.value,
                experts_min=first, num_experts=num_experts, extras=extras.of(experts),
            )  # fmt: skip
            out = part if out is None else out + part
        return cast(torch.Tensor, out)


def experts_per_group(layer: Any, dtype: torch.dtype) -> int:
    """How many experts dequantize at once: all that fit ``EXPERT_GROUP_BYTES``."""
    hidden, intermediate = layer.hidden_size, layer.intermediate_size_per_partition
    itemsize = torch.empty((), dtype=dtype).element_size()
    expert_bytes = 3 * hidden * intermediate * itemsize  # gate, up and down
    return max(1, min(layer.local_num_experts, EXPERT_GROUP_BYTES // expert_bytes))


def check_layer(layer: RoutedExperts) -> None:
    """Refuse a loaded MoE layer that ops/moe.py cannot run as its model asks."""
    ours = (HpuUnquantizedFusedMoEMethod, HpuQuantizedMoE)
    if not isinstance(layer.quant_method, ours):
        refuse(
            f"quantized experts ({layer.quant_method.method_name})",
            "use an unquantized (bf16/fp32) checkpoint",
        )
    if layer.scoring_func not in SCORING_FUNCS:
        refuse(
            f"'{layer.scoring_func}' router scoring",
            f"use a model scoring with {' or '.join(SCORING_FUNCS)}",
        )
    if layer.apply_router_weight_on_input and layer.top_k != 1:
        refuse(
            f"routing weights applied to the input of {layer.top_k} experts per token",
            "use a top-1 model (as Llama 4) or one that weights the outputs",
        )


def check_router(router: FusedMoERouter) -> None:
    """Refuse routers whose work the monolithic method would skip: it routes from
    the router logits itself, so a router's own extra output would be lost."""
    if isinstance(router, ZeroExpertRouter):
        refuse(
            "zero experts (tokens routed to an identity expert)",
            "use another MoE model",
        )
    if isinstance(router, RoutingSimulatorRouter):
        refuse(
            "simulated routing",
            "unset VLLM_MOE_ROUTING_SIMULATION_STRATEGY",
        )


def check_moe_layers(model: torch.nn.Module) -> None:
    """Run at load time over every MoE layer of the model."""
    for module in model.modules():
        if isinstance(module, RoutedExperts):
            check_layer(module)
        elif isinstance(module, MoERunner):
            check_router(module.router)
