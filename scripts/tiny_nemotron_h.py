"""The tiny Nemotron-H build_tiny_models.py writes (NemotronHForCausalLM), from
transformers' own NemotronHConfig, with the hybrids' sizes (tiny_families.py):
one decoder with each kind of Nemotron-H layer, "M-*ME" in its pattern's
letters: Mamba2 (eight heads of 16 in two groups, 16-token scan chunks), a
dense relu2 MLP, attention without positions (four heads of 32 on two KV
heads: a 16-token block's page holds a state), Mamba2 again, then the MoE of
Nemotron 3: eight non-gated relu2 experts in two groups (one kept per token),
two per token scored by sigmoid with a selection bias, renormalised and
scaled, run in a latent space of 32 beside a relu2 shared expert.
"""

from pathlib import Path
from typing import Any

from tiny_families import GRANITE_CHUNK_SIZE, Init, hybrid_shape, save_hybrid
from transformers import GenerationConfig, NemotronHConfig, NemotronHForCausalLM

NEMOTRON_H_LAYERS = [
    "linear_attention",
    "mlp",
    "full_attention",
    "linear_attention",
    "moe",
]


def build_nemotron_h(
    shape: dict[str, Any],
    generation_config: GenerationConfig,
    init: Init,
    out_dir: Path,
) -> None:
    hybrid = hybrid_shape(shape, NEMOTRON_H_LAYERS)
    hidden = hybrid["hidden_size"]
    config = NemotronHConfig(
        **hybrid | {"intermediate_size": 2 * hidden},
        num_key_value_heads=2,
        head_dim=32,
        mamba_num_heads=8,
        mamba_head_dim=16,
        n_groups=2,
        ssm_state_size=8,
        conv_kernel=4,
        chunk_size=GRANITE_CHUNK_SIZE,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        moe_intermediate_size=hidden // 2,
        moe_latent_size=hidden // 2,
        n_shared_experts=1,
        moe_shared_expert_intermediate_size=hidden,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        dtype="float32",
    )
    save_hybrid(NemotronHForCausalLM(config), generation_config, init, out_dir)


NEMOTRON_H_BUILDERS = {"tiny-nemotron-h": build_nemotron_h}
