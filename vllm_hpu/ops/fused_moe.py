"""vLLM's FusedMoE layers on the plugin: the out-of-tree unquantized MoE method, and
the base of the quantized ones (quantization/fp8_moe.py, quantization/packed_moe.py).

For an out-of-tree platform vLLM picks no expert kernel (``experts_cls`` is None),
so its method cannot even say whether it is monolithic. Ours is: it routes from the
router logits and runs the experts itself (``ops/moe.py``); what it cannot run is
refused when the model is loaded, naming the option or model to change.
"""

import abc
from typing import TYPE_CHECKING, Any, NoReturn, cast

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

from vllm_hpu.ops.activations import (
    ACTIVATIONS,
    GATED_ACTIVATIONS,
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
# Dequantized bytes of one group of quantized experts in a forward: bounds the
# transient copy (DeepSeek-V3's 256 experts would be 22 GiB in bf16 at once).
EXPERT_GROUP_BYTES = 1 << 30
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
    Expert biases and gpt-oss's clamped SwiGLU run on unquantized experts and
    on gpt-oss's own MXFP4 experts (``with_extras``: the method loads and runs
    them); the other quantized methods load their weights without them."""
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
    activations = GATED_ACTIVATIONS if with_extras else tuple(ACTIVATIONS)
    if moe.activation.value not in activations:
        refuse(
            f"the '{moe.activation.value}' expert activation"
            + ("" if with_extras else " on quantized experts"),
            f"use a model with a gated {'/'.join(activations)} activation",
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
            if extras.has_bias or layer.activation.value == SWIGLUOAI:
                refuse(
                    "expert biases or the clamped SwiGLU under Intel Neural Compressor",
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
        extras = expert_extras(layer)
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


_register_oot(UnquantizedFusedMoEMethod, HpuUnquantizedFusedMoEMethod)
