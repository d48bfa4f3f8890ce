"""vLLM's FusedMoE layers on the plugin: the out-of-tree unquantized MoE method.

For an out-of-tree platform vLLM picks no expert kernel (``experts_cls`` is None),
so its method cannot even say whether it is monolithic. Ours is: it routes from the
router logits and runs the experts itself (``ops/moe.py``); what it cannot run is
refused when the model is loaded, naming the option or model to change.
"""

from typing import TYPE_CHECKING, cast

import torch
from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig
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
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
    UnquantizedFusedMoEMethod,
)

from vllm_hpu.ops.custom_ops import _register_oot
from vllm_hpu.ops.moe import ACTIVATIONS, MoeRouting, fused_experts, select_experts

if TYPE_CHECKING:
    from vllm.model_executor.layers.fused_moe.runner.shared_experts import (
        SharedExperts,
    )

SCORING_FUNCS = ("softmax", "sigmoid")
# FusedMoEConfig fields that change the expert activation; ops/moe.py has none.
ACTIVATION_PARAMS = (
    "swiglu_limit",
    "swiglu_alpha",
    "swiglu_beta",
    "activation_situ_beta",
    "activation_situ_linear_beta",
)


def _refuse(what: str, fix: str) -> None:
    raise ValueError(f"The HPU plugin does not support {what} in MoE layers: {fix}.")


def check_supported(moe: FusedMoEConfig) -> None:
    """Refuse, at model construction, the MoE configurations ops/moe.py lacks."""
    parallel = moe.moe_parallel_config
    if parallel.use_ep or parallel.enable_eplb:
        _refuse(
            "expert parallelism",
            "drop --enable-expert-parallel / --enable-eplb; tensor parallelism "
            "splits every expert instead",
        )
    if moe.has_bias:
        _refuse("expert biases", "use a model whose experts have no bias")
    if moe.activation.value not in ACTIVATIONS:
        _refuse(
            f"the '{moe.activation.value}' expert activation",
            f"use a model with a gated {'/'.join(ACTIVATIONS)} activation",
        )
    clamped = [name for name in ACTIVATION_PARAMS if getattr(moe, name) is not None]
    if clamped:
        _refuse(
            f"expert activation parameters ({', '.join(clamped)})",
            "use a model whose experts use the plain gated activation",
        )
    if moe.has_hash_routing:
        _refuse("hash routing (experts chosen by token id)", "use another MoE model")


def check_layer(layer: RoutedExperts) -> None:
    """Refuse a loaded MoE layer that ops/moe.py cannot run as its model asks."""
    if not isinstance(layer.quant_method, HpuUnquantizedFusedMoEMethod):
        _refuse(
            f"quantized experts ({layer.quant_method.method_name})",
            "use an unquantized (bf16/fp32) checkpoint",
        )
    if layer.scoring_func not in SCORING_FUNCS:
        _refuse(
            f"'{layer.scoring_func}' router scoring",
            f"use a model scoring with {' or '.join(SCORING_FUNCS)}",
        )
    if layer.apply_router_weight_on_input:
        _refuse("routing weights applied to the input", "use another MoE model")


def check_router(router: FusedMoERouter) -> None:
    """Refuse routers whose work the monolithic method would skip: it routes from
    the router logits itself, so a router's own extra output would be lost."""
    if isinstance(router, ZeroExpertRouter):
        _refuse(
            "zero experts (tokens routed to an identity expert)",
            "use another MoE model",
        )
    if isinstance(router, RoutingSimulatorRouter):
        _refuse(
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


def routing_of(layer: RoutedExperts) -> MoeRouting:
    """The layer's routing as vLLM's own routers read it: groups only with grouped
    top-k, and the scaling factor only where they apply it (grouped or biased
    routing; the plain top-k router leaves it to the model)."""
    grouped = layer.use_grouped_topk
    biased = layer.e_score_correction_bias is not None
    return MoeRouting(
        top_k=layer.top_k,
        renormalize=layer.renormalize,
        scoring_func=layer.scoring_func,
        num_expert_group=layer.num_expert_group if grouped else None,
        topk_group=layer.topk_group if grouped else None,
        routed_scaling_factor=layer.routed_scaling_factor if grouped or biased else 1.0,
        e_score_correction_bias=layer.e_score_correction_bias,
        custom_routing_function=layer.custom_routing_function,
    )


class HpuUnquantizedFusedMoEMethod(UnquantizedFusedMoEMethod):
    """Routing and experts in one step from the router logits (monolithic): vLLM's
    separate routers call kernels of vllm._C, which the plugin does not have."""

    def __init__(self, moe: FusedMoEConfig):
        check_supported(moe)
        super().__init__(moe)

    @property
    def is_monolithic(self) -> bool:
        return True

    def apply_monolithic(
        self,
        layer: RoutedExperts,
        x: torch.Tensor,
        router_logits: torch.Tensor,
        input_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: [num_tokens, hidden_size]; router_logits: [num_tokens, num_experts]."""
        topk_weights, topk_ids = select_experts(x, router_logits, routing_of(layer))
        return self.forward_oot(layer, x, topk_weights, topk_ids, None, None)

    def forward_oot(
        self,
        layer: RoutedExperts,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        shared_experts: "SharedExperts | None",
        shared_experts_input: torch.Tensor | None,
    ) -> torch.Tensor:
        """Shared experts, if any, are run by vLLM's MoE runner around this call;
        with Intel Neural Compressor on, its ``moe_op`` runs the experts."""
        moe_op = getattr(layer, "moe_op", None)
        if moe_op is not None:
            routing_weights = topk_weights.to(x.dtype)
            return moe_op(
                x, topk_ids.long(), routing_weights, True, layer.activation.value
            )
        return fused_experts(
            x,
            cast(torch.Tensor, layer.w13_weight),
            cast(torch.Tensor, layer.w2_weight),
            topk_weights,
            topk_ids,
            layer.activation.value,
        )


_register_oot(UnquantizedFusedMoEMethod, HpuUnquantizedFusedMoEMethod)
