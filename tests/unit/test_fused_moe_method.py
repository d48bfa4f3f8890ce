"""The out-of-tree MoE method: what vLLM constructs on the plugin, and the MoE
configurations it refuses while the model is built, each naming its fix."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.config import (
    FusedMoEConfig,
    FusedMoEParallelConfig,
    RoutingMethodType,
)
from vllm.model_executor.layers.fused_moe.router.zero_expert_router import (
    ZeroExpertRouter,
)
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
    UnquantizedFusedMoEMethod,
)

from vllm_hpu.ops.activations import GATED_ACTIVATIONS
from vllm_hpu.ops.fused_moe import HpuUnquantizedFusedMoEMethod, check_supported
from vllm_hpu.quantization.moe_methods import check_layer, check_router


def moe_config(**changes) -> FusedMoEConfig:
    config = FusedMoEConfig(
        num_experts=4,
        experts_per_token=2,
        hidden_dim=64,
        intermediate_size=32,
        num_local_experts=4,
        num_logical_experts=4,
        activation=MoEActivation.SILU,
        device="cpu",
        routing_method=RoutingMethodType.Renormalize,
        moe_parallel_config=FusedMoEParallelConfig.make_no_parallel(),
        in_dtype=torch.float32,
    )
    return dataclasses.replace(config, **changes)


def test_vllm_builds_the_monolithic_hpu_method():
    with set_current_vllm_config(VllmConfig()):
        method = UnquantizedFusedMoEMethod(moe_config())
    assert isinstance(method, HpuUnquantizedFusedMoEMethod)
    assert method.is_monolithic


@pytest.mark.parametrize(
    "layout",
    [
        {"ep_size": 2},
        {"ep_size": 2, "enable_eplb": True},
        {"ep_size": 4, "sp_size": 2},  # EP with TP and DP: sequence-parallel
    ],
)
def test_expert_parallelism_is_built(layout):
    """--enable-expert-parallel (with --enable-eplb, with both tensor and data
    parallelism): each rank builds the method for its experts."""
    parallel = dataclasses.replace(
        FusedMoEParallelConfig.make_no_parallel(), use_ep=True, **layout
    )
    with set_current_vllm_config(VllmConfig()):
        method = UnquantizedFusedMoEMethod(
            moe_config(moe_parallel_config=parallel, num_local_experts=2)
        )
    assert isinstance(method, HpuUnquantizedFusedMoEMethod)


REFUSED = {
    "'swigluoai_uninterleave' expert activation": {
        "activation": MoEActivation.SWIGLUOAI_UNINTERLEAVE
    },
    # The clamp and gain belong to the clamped SwiGLU, its beta to none here.
    "expert activation parameters \\(swiglu_limit\\)": {"swiglu_limit": 7.0},
    "expert activation parameters \\(swiglu_beta\\)": {
        "activation": MoEActivation.SWIGLUOAI,
        "swiglu_beta": 1.0,
    },
    "hash routing": {"has_hash_routing": True},
}


@pytest.mark.parametrize("what", sorted(REFUSED))
def test_unsupported_moe_configurations_are_refused(what):
    with pytest.raises(ValueError, match=f"does not support .*{what}.*: "):
        UnquantizedFusedMoEMethod(moe_config(**REFUSED[what]))


@pytest.mark.parametrize("activation", list(MoEActivation), ids=lambda a: a.value)
def test_every_vllm_expert_activation_runs_or_is_refused(activation):
    """vLLM's whole list: a new upstream activation is refused until ops/moe.py
    computes it, never run as another one."""
    if not activation.is_gated:
        # vLLM itself refuses ungated experts off CUDA, XPU and ROCm.
        with pytest.raises(NotImplementedError, match="is_act_and_mul=False"):
            moe_config(activation=activation)
        return
    with set_current_vllm_config(VllmConfig()):
        if activation.value in GATED_ACTIVATIONS:
            UnquantizedFusedMoEMethod(moe_config(activation=activation))
        else:
            with pytest.raises(ValueError, match=f"'{activation.value}' expert"):
                UnquantizedFusedMoEMethod(moe_config(activation=activation))


def test_gpt_oss_experts_are_built():
    """Biased experts with the clamped SwiGLU and its parameters (gpt-oss)."""
    config = moe_config(
        activation=MoEActivation.SWIGLUOAI,
        has_bias=True,
        swiglu_alpha=1.702,
        swiglu_limit=7.0,
    )
    with set_current_vllm_config(VllmConfig()):
        assert isinstance(
            UnquantizedFusedMoEMethod(config), HpuUnquantizedFusedMoEMethod
        )


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"has_bias": True}, "expert biases on quantized experts"),
        ({"activation": MoEActivation.SWIGLUOAI}, "'swigluoai' expert activation on"),
    ],
)
def test_gpt_oss_pieces_are_refused_on_quantized_experts(changes, named):
    """The quantized methods hand ops/moe.py bare weights: no bias, plain gate."""
    with pytest.raises(ValueError, match=named):
        check_supported(moe_config(**changes))


@pytest.mark.parametrize("top_k", [1, 2])
def test_routing_weights_on_the_input_run_for_one_expert_per_token(top_k):
    """Llama 4 (top-1) runs; several experts would each need their own input."""
    with set_current_vllm_config(VllmConfig()):
        method = UnquantizedFusedMoEMethod(moe_config())
    layer = SimpleNamespace(
        quant_method=method,
        scoring_func="sigmoid",
        apply_router_weight_on_input=True,
        top_k=top_k,
    )
    if top_k == 1:
        check_layer(layer)
        return
    with pytest.raises(ValueError, match="applied to the input of 2 experts"):
        check_layer(layer)


def test_zero_expert_router_is_refused():
    """Its identity experts' output is computed by the router, which the
    monolithic method skips: refused rather than silently dropped."""
    router = ZeroExpertRouter(
        top_k=2,
        global_num_experts=4,
        e_score_correction_bias=torch.zeros(6),
        num_logical_experts=4,
        zero_expert_type="identity",
    )
    with pytest.raises(ValueError, match="does not support zero experts"):
        check_router(router)
