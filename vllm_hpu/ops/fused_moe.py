"""vLLM's FusedMoE layers on the plugin: the out-of-tree unquantized MoE method, and
the routing every MoE method shares (quantized ones: quantization/quantized_moe.py).

For an out-of-tree platform vLLM picks no expert kernel (``experts_cls`` is None),
so its method cannot even say whether it is monolithic. Ours is: it routes from the
router logits and runs the experts itself (``ops/moe.py``); what it cannot run is
refused when the model is loaded, naming the option or model to change.
"""

from typing import TYPE_CHECKING, NoReturn, cast

import torch
from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
    UnquantizedFusedMoEMethod,
)

from vllm_hpu.ops.activations import (
    ACTIVATIONS,
    GATED_ACTIVATIONS,
    NON_GATED_ACTIVATIONS,
    SWIGLUOAI,
    SWIGLUOAI_ALPHA,
    SWIGLUOAI_LIMIT,
)
from vllm_hpu.ops.custom_ops import _register_oot
from vllm_hpu.ops.moe import (
    ExpertExtras,
    MoeRouting,
    fused_experts,
    local_experts,
    select_experts,
    weights_on_input,
)

if TYPE_CHECKING:
    from vllm.model_executor.layers.fused_moe.runner.shared_experts import (
        SharedExperts,
    )

SCORING_FUNCS = ("softmax", "sigmoid")
# FusedMoEConfig fields that change the expert activation: ops/moe.py takes the
# clamped SwiGLU's two (with "swigluoai", on experts that take the extras), none
# of the others.
SWIGLUOAI_PARAMS = ("swiglu_limit", "swiglu_alpha")
ACTIVATION_PARAMS = (
    *SWIGLUOAI_PARAMS,
    "swiglu_beta",
    "activation_situ_beta",
    "activation_situ_linear_beta",
)


def refuse(what: str, fix: str) -> NoReturn:
    raise ValueError(f"The HPU plugin does not support {what} in MoE layers: {fix}.")


def check_supported(moe: FusedMoEConfig, with_extras: bool = False) -> None:
    """Refuse, at model construction, the MoE configurations ops/moe.py lacks.
    Expert biases, gpt-oss's clamped SwiGLU and experts without a gate run on
    unquantized experts, the first two also on gpt-oss's own MXFP4 experts
    (``with_extras``: the method loads and runs them); the other quantized
    methods load their weights without them."""
    parallel = moe.moe_parallel_config
    if parallel.enable_eplb:
        refuse(
            "expert load balancing",
            "drop --enable-eplb; --enable-expert-parallel alone places experts "
            "statically",
        )
    if moe.is_sequence_parallel:
        refuse(
            "sequence-parallel experts (expert parallelism with both tensor and "
            "data parallelism)",
            "use --enable-expert-parallel with tensor parallelism or with data "
            "parallelism, not both",
        )
    if moe.has_bias and not with_extras:
        refuse(
            "expert biases on quantized experts",
            "use the unquantized checkpoint or one whose experts have no bias",
        )
    activations = (
        (*GATED_ACTIVATIONS, *NON_GATED_ACTIVATIONS)
        if with_extras
        else tuple(ACTIVATIONS)
    )
    if moe.activation.value not in activations:
        refuse(
            f"the '{moe.activation.value}' expert activation"
            + ("" if with_extras else " on quantized experts"),
            f"use a model whose experts use {'/'.join(activations)}",
        )
    clamped = [
        name
        for name in unsupported_params(moe.activation.value, with_extras)
        if getattr(moe, name) is not None
    ]
    if clamped:
        refuse(
            f"expert activation parameters ({', '.join(clamped)})",
            "use a model whose experts use the plain gated activation",
        )
    if moe.has_hash_routing:
        refuse("hash routing (experts chosen by token id)", "use another MoE model")


def unsupported_params(activation: str, with_extras: bool) -> tuple[str, ...]:
    """The activation parameters ops/moe.py cannot apply to ``activation``."""
    if activation == SWIGLUOAI and with_extras:
        return tuple(p for p in ACTIVATION_PARAMS if p not in SWIGLUOAI_PARAMS)
    return ACTIVATION_PARAMS


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


def route(
    layer: RoutedExperts, x: torch.Tensor, router_logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_weights, topk_ids [num_tokens, top_k] over the layer's own experts:
    with expert parallelism, ids are local slots and pairs routed to other
    ranks weigh 0 (vLLM's runner sums the ranks' outputs)."""
    topk_weights, topk_ids = select_experts(x, router_logits, routing_of(layer))
    expert_map = layer.expert_map
    if expert_map is None:
        return topk_weights, topk_ids
    return local_experts(topk_weights, topk_ids, expert_map)


class HpuUnquantizedFusedMoEMethod(UnquantizedFusedMoEMethod):
    """Routing and experts in one step from the router logits (monolithic): vLLM's
    separate routers call kernels of vllm._C, which the plugin does not have."""

    def __init__(self, moe: FusedMoEConfig):
        check_supported(moe, with_extras=True)
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
        topk_weights, topk_ids = route(layer, x, router_logits)
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
        if layer.apply_router_weight_on_input:
            x, topk_weights = weights_on_input(x, topk_weights)
        extras = expert_extras(layer)
        moe_op = getattr(layer, "moe_op", None)
        if moe_op is not None:
            if extras.has_bias or layer.activation.value not in ACTIVATIONS:
                refuse(
                    "expert biases, the clamped SwiGLU or experts without a gate "
                    "under Intel Neural Compressor",
                    "run the model without --quantization inc",
                )
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
            extras=extras,
        )


def expert_extras(layer: RoutedExperts) -> ExpertExtras:
    """The layer's expert biases (``has_bias``) and SwiGLU parameters; vLLM's
    kernels take 1.702 and 7.0 where the model leaves them unset (gpt-oss)."""
    alpha, limit = layer.swiglu_alpha, layer.swiglu_limit
    return ExpertExtras(
        w13_bias=getattr(layer, "w13_bias", None),
        w2_bias=getattr(layer, "w2_bias", None),
        swiglu_alpha=SWIGLUOAI_ALPHA if alpha is None else alpha,
        swiglu_limit=SWIGLUOAI_LIMIT if limit is None else limit,
    )


_register_oot(UnquantizedFusedMoEMethod, HpuUnquantizedFusedMoEMethod)
