"""The out-of-tree MoE method: what vLLM constructs on the plugin, and the MoE
configurations it refuses while the model is built, each naming its fix."""

import dataclasses

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

from vllm_hpu.ops.activations import ACTIVATIONS
from vllm_hpu.ops.fused_moe import HpuUnquantizedFusedMoEMethod, check_router


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


REFUSED = {
    "expert parallelism": {
        "moe_parallel_config": dataclasses.replace(
            FusedMoEParallelConfig.make_no_parallel(), use_ep=True, ep_size=2
        )
    },
    "expert biases": {"has_bias": True},
    "'swigluoai' expert activation": {"activation": MoEActivation.SWIGLUOAI},
    "expert activation parameters \\(swiglu_limit\\)": {"swiglu_limit": 7.0},
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
        if activation.value in ACTIVATIONS:
            UnquantizedFusedMoEMethod(moe_config(activation=activation))
        else:
            with pytest.raises(ValueError, match=f"'{activation.value}' expert"):
                UnquantizedFusedMoEMethod(moe_config(activation=activation))


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
