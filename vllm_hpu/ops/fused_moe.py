"""vLLM's FusedMoE layers on the plugin: what every MoE method of the plugin runs
(routing, then the experts, only the routed ones at small batch), and the
out-of-tree unquantized method (quantized ones: quantization/moe_methods.py).

For an out-of-tree platform vLLM picks no expert kernel (``experts_cls`` is None),
so its method cannot even say whether it is monolithic. Ours is: it routes from the
router logits and runs the experts itself (``ops/moe.py``); what it cannot run is
refused when the model is loaded, naming the option or model to change.
"""

from dataclasses import dataclass
from typing import Any, NoReturn, cast

import torch
from vllm.distributed.eplb.eplb_state import EplbLayerState
from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
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
    physical_experts,
    reads_routed_only,
    record_expert_load,
    routed_experts,
    select_experts,
    weights_on_input,
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
    Expert biases and gpt-oss's clamped SwiGLU run on unquantized experts and
    on gpt-oss's own MXFP4 experts (``with_extras``: the method loads and runs
    them); the other quantized methods load their weights without them."""
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
    # vLLM's router of the layer (linked at load: quantization/moe_methods.py):
    # what its own routing would hand on, the logical ids to a capture (routed
    # experts returned) and, with EPLB, the pairs to physical experts.
    router = getattr(layer, "router", None)
    capture = getattr(router, "capture_fn", None)
    if capture is not None:
        capture(topk_ids)
    eplb = getattr(router, "eplb_state", None)
    if eplb is not None and eplb.logical_to_physical_map is not None:
        topk_ids = balanced_experts(topk_ids, eplb)
    expert_map = layer.expert_map
    if expert_map is None:
        return topk_weights, topk_ids
    return local_experts(topk_weights, topk_ids, expert_map)


def balanced_experts(topk_ids: torch.Tensor, eplb: EplbLayerState) -> torch.Tensor:
    """Logical expert ids made physical ones, their load recorded (EPLB)."""
    logical_to_physical = eplb.logical_to_physical_map
    assert logical_to_physical is not None
    assert eplb.logical_replica_count is not None
    assert eplb.expert_load_view is not None
    assert eplb.should_record_tensor is not None
    assert eplb.num_unpadded_tokens_tensors is not None
    physical = physical_experts(
        topk_ids, logical_to_physical, eplb.logical_replica_count
    )
    record_expert_load(
        physical,
        eplb.expert_load_view,
        eplb.should_record_tensor,
        eplb.num_unpadded_tokens_tensors[0],
    )
    return physical


# Bytes of expert weights one group copies in a forward (dequantized, or
# gathered at small batch): bounds the transient copy (DeepSeek-V3's 256
# experts would be 22 GiB in bf16 at once).
EXPERT_GROUP_BYTES = 1 << 30


@dataclass(frozen=True)
class ExpertGroup:
    """The experts one call of the expert kernel runs: ``experts`` (a slice of
    the layer's, or local ids gathered at small batch) hold slots ``first``
    onwards of ``num_slots``; ``topk_ids`` route the (token, k) pairs to slots."""

    experts: slice | torch.Tensor
    first: int
    num_slots: int
    topk_weights: torch.Tensor
    topk_ids: torch.Tensor


class HpuMoEMethod:
    """What every MoE method of the plugin runs, a mixin ahead of vLLM's method
    (monolithic: routing and experts in one step from the router logits; vLLM's
    separate routers call kernels of vllm._C, which the plugin does not have).

    The experts run group by group (``EXPERT_GROUP_BYTES`` where the weights
    are copied). When a pass's (token, k) pairs are fewer than the layer's
    experts, only the routed experts' weights are read (``routed_experts``:
    gathered, or dequantized for quantized ones), padded to a count the
    bucket fixes. A subclass says how it gets weights (``expert_weights``)."""

    copies_weights = False  # every forward copies the weights (dequantization)

    @property
    def is_monolithic(self) -> bool:
        return True

    def expert_weights(
        self, layer: Any, experts: slice | torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """w13 [n, 2 * intermediate, hidden] and w2 [n, hidden, intermediate] of
        ``experts`` (a slice of the layer's, or their local ids), in ``dtype``."""
        raise NotImplementedError

    def prepare_input(self, layer: Any, x: torch.Tensor) -> torch.Tensor:
        """The experts' input as the format computes with it (as is by default)."""
        return x

    def max_gathered(self, layer: Any, dtype: torch.dtype) -> int:
        """The most experts a pass gathers rather than reading them all.
        Weights dequantized in the forward are copied anyway: gathered packed
        first (all but the full count). Weights used as they are: none where
        the kernel reads only experts with rows anyway (the CPU's grouped
        GEMM); else a gather reads and writes the experts' bytes before the
        kernel reads them, three times the gathered bytes against once every
        expert's: a third."""
        num_experts = layer.local_num_experts
        if self.copies_weights:
            return num_experts - 1
        sizes = (layer.hidden_size, layer.intermediate_size_per_partition)
        return 0 if reads_routed_only(*sizes, dtype) else num_experts // 3

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
        """topk_ids: local expert ids [num_tokens, top_k] (weight 0 elsewhere)."""
        num_experts = layer.local_num_experts
        routed = routed_experts(
            topk_weights, topk_ids, num_experts, self.max_gathered(layer, x.dtype)
        )
        gathered = routed is not None
        experts, topk_ids = routed if routed is not None else (None, topk_ids)
        num_slots = num_experts if experts is None else len(experts)
        per_group = experts_per_group(layer, x.dtype, self.copies_weights or gathered)
        inputs, extras = self.prepare_input(layer, x), expert_extras(layer)
        out = None
        for first in range(0, num_slots, per_group):
            group = slice(first, min(first + per_group, num_slots))
            chosen = group if experts is None else experts[group]
            part = self.run_group(
                layer,
                inputs,
                ExpertGroup(chosen, first, num_slots, topk_weights, topk_ids),
                extras.of(chosen),
            )
            out = part if out is None else out + part
        return cast(torch.Tensor, out)

    def run_group(
        self, layer: Any, x: torch.Tensor, group: ExpertGroup, extras: ExpertExtras
    ) -> torch.Tensor:
        """The group's experts' part of the output, [num_tokens, hidden_size]."""
        w13, w2 = self.expert_weights(layer, group.experts, x.dtype)
        return fused_experts(
            x, w13, w2, group.topk_weights, group.topk_ids, layer.activation.value,
            experts_min=group.first, num_experts=group.num_slots, extras=extras,
        )  # fmt: skip


def experts_per_group(layer: Any, dtype: torch.dtype, copied: bool) -> int:
    """How many experts one kernel call runs: all of them, or where the
    weights are copied, as many as fit ``EXPERT_GROUP_BYTES``."""
    hidden, intermediate = layer.hidden_size, layer.intermediate_size_per_partition
    itemsize = torch.empty((), dtype=dtype).element_size()
    expert_bytes = 3 * hidden * intermediate * itemsize  # gate, up and down
    fit = EXPERT_GROUP_BYTES // expert_bytes if copied else layer.local_num_experts
    return max(1, min(layer.local_num_experts, fit))


class HpuUnquantizedFusedMoEMethod(HpuMoEMethod, UnquantizedFusedMoEMethod):
    """Unquantized experts: the layer's own weights (gathered at small batch);
    with Intel Neural Compressor on, its ``moe_op`` runs all the experts."""

    def __init__(self, moe: FusedMoEConfig):
        check_supported(moe, with_extras=True)
        super().__init__(moe)

    def expert_weights(
        self, layer: Any, experts: slice | torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        w13, w2 = (
            cast(torch.Tensor, layer.w13_weight),
            cast(torch.Tensor, layer.w2_weight),
        )
        return w13[experts], w2[experts]

    def run_experts(
        self,
        layer: Any,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
    ) -> torch.Tensor:
        moe_op = getattr(layer, "moe_op", None)
        if moe_op is None:
            return super().run_experts(layer, x, topk_weights, topk_ids)
        if expert_extras(layer).has_bias or layer.activation.value == SWIGLUOAI:
            refuse(
                "expert biases or the clamped SwiGLU under Intel Neural Compressor",
                "run the model without --quantization inc",
            )
        routing_weights = topk_weights.to(x.dtype)
        return moe_op(x, topk_ids.long(), routing_weights, True, layer.activation.value)


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
