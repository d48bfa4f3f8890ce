"""The plugin's MoE methods: the base of the quantized ones (fp8_moe.py,
packed_moe.py: vLLM's method keeps its weights and loaders, the plugin runs the
experts with ops/fused_moe.py and ops/moe.py), and the load-time check that
every MoE layer runs on one of the plugin's methods."""

import abc
from typing import Any

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
    HpuMoEMethod,
    HpuUnquantizedFusedMoEMethod,
    refuse,
)


class HpuQuantizedMoE(HpuMoEMethod, abc.ABC):
    """Mixin ahead of vLLM's MoE method: its ``create_weights`` stays, its kernels do
    not. Weights stay packed; each forward dequantizes the experts it reads."""

    copies_weights = True

    def get_fused_moe_quant_config(self, layer: Any) -> Any:
        return None  # vLLM's kernels' description: no kernel of vLLM runs

    def process_weights_after_loading(self, layer: Any) -> None:
        """Instead of vLLM's repacking: weights as loaded (scales maybe normalised)."""

    @abc.abstractmethod
    def dequantize(
        self, layer: Any, experts: slice | torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """w13 [n, 2 * intermediate, hidden] and w2 [n, hidden, intermediate] of
        ``experts`` (a slice of the layer's, or their local ids), in ``dtype``."""

    def expert_weights(
        self, layer: Any, experts: slice | torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.dequantize(layer, experts, dtype)


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
    """At load time, check every MoE layer and give its routed experts their runner's
    router, whose EPLB state and capture ops/fused_moe.py::route serves."""
    for module in model.modules():
        if isinstance(module, RoutedExperts):
            check_layer(module)
        elif isinstance(module, MoERunner):
            check_router(module.router)
            module.routed_experts.router = module.router  # type: ignore[assignment]
