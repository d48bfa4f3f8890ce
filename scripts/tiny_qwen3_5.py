"""The tiny Qwen3.5 checkpoints build_tiny_models.py writes, from transformers'
own config classes, with the hybrids' sizes (tiny_families.py): three gated
delta-net layers before one gated attention layer, as in Qwen3.5's own 3:1
pattern; the delta-net's projections in Qwen3.5's separate (not interleaved)
layout; partial rotary with interleaved M-RoPE sections; a dense SwiGLU MLP, or
for the MoE four experts of which two per token beside the sigmoid-gated
shared expert.
"""

from pathlib import Path
from typing import Any

from tiny_families import QWEN3_NEXT_LAYERS, Init, hybrid_shape, save_hybrid
from transformers import (
    GenerationConfig,
    Qwen3_5ForCausalLM,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
)

# Heads of 32 with a quarter of each rotated: four rotary frequencies, split
# between M-RoPE's time, height and width sections (interleaved).
QWEN3_5_ATTENTION = {
    "num_key_value_heads": 2,
    "head_dim": 32,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
}
# Two key heads and four value heads of 16 (each key head serves two value
# heads), conv width 4.
QWEN3_5_DELTA_NET = {
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
}


def qwen3_5_text_config(shape: dict[str, Any], moe: bool) -> Any:
    """The decoder of the tiny Qwen3.5 (dense or MoE)."""
    common = {
        **hybrid_shape(shape, QWEN3_NEXT_LAYERS),
        **QWEN3_5_ATTENTION,
        **QWEN3_5_DELTA_NET,
        "dtype": "float32",
    }
    if not moe:
        return Qwen3_5TextConfig(**common)
    hidden = common["hidden_size"]
    return Qwen3_5MoeTextConfig(
        **common,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=hidden // 2,
        shared_expert_intermediate_size=hidden // 2,
    )


def build_qwen3_5(
    shape: dict[str, Any],
    generation_config: GenerationConfig,
    init: Init,
    out_dir: Path,
) -> None:
    """Qwen3.5 dense (Qwen3_5ForCausalLM)."""
    model = Qwen3_5ForCausalLM(qwen3_5_text_config(shape, moe=False))
    save_hybrid(model, generation_config, init, out_dir)


def build_qwen3_5_moe(
    shape: dict[str, Any],
    generation_config: GenerationConfig,
    init: Init,
    out_dir: Path,
) -> None:
    """Qwen3.5 MoE (Qwen3_5MoeForCausalLM)."""
    model = Qwen3_5MoeForCausalLM(qwen3_5_text_config(shape, moe=True))
    save_hybrid(model, generation_config, init, out_dir)


QWEN3_5_BUILDERS = {
    "tiny-qwen3.5": build_qwen3_5,
    "tiny-qwen3.5-moe": build_qwen3_5_moe,
}
