"""The tiny gpt-oss, Llama 4 (text) and hybrid checkpoints build_tiny_models.py
writes, made with transformers' own config classes, and sized so that each
family's features bind on prompts of a few dozen tokens: gpt-oss's attention
sinks, alternating sliding window, biased experts with the clamped SwiGLU; Llama
4's chunked local attention, NoPE layer with attention temperature tuning and
top-1 experts weighted on their input beside a shared expert; Granite-4.0-H's
Mamba2 layers (16-token scan chunks) around one NoPE attention layer, with
Granite's multipliers; Qwen3-Next's gated delta-net layers (two key heads, four
value heads) before one gated attention layer with partial rotary.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import (
    GenerationConfig,
    GptOssConfig,
    GptOssForCausalLM,
    GraniteMoeHybridConfig,
    GraniteMoeHybridForCausalLM,
    Llama4ForCausalLM,
    Llama4TextConfig,
    PreTrainedModel,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

# gpt-oss alternates windowed (even) and full (odd) layers; the window is not a
# multiple of the tests' 16-token blocks.
GPT_OSS_WINDOW = 40
# Sinks near the scores' scale, so that they take a visible share of the softmax.
SINK_MEAN, SINK_STD = 1.0, 1.0
# Expert weights large enough that gpt-oss's SwiGLU clamp (7.0) binds.
GPT_OSS_EXPERT_STD = 0.3
# Llama 4: chunks the test prompts cross; the temperature of the NoPE layer
# grows from position FLOOR_SCALE on (8192 in the real models).
CHUNK_SIZE = 40
FLOOR_SCALE = 16
ATTN_SCALE = 0.5

# Hybrids: three state layers around one attention layer (index 1 for Granite,
# 3 for Qwen3-Next, as in their real layouts' patterns), a 64-wide residual
# stream and fp32 state pages that fit a 16-token attention block (design_hybrid
# §5). A state layer's decay rate -exp(A_log) is drawn in [DECAY_MIN, DECAY_MAX]:
# slow enough that a state carries across Granite's 16-token scan chunks and
# Qwen3-Next's 64-token ones (near 0, the default init, would forget within a
# few tokens).
HYBRID_HIDDEN = 64
GRANITE_LAYERS = ["linear_attention", "full_attention", *["linear_attention"] * 2]
QWEN3_NEXT_LAYERS = [*["linear_attention"] * 3, "full_attention"]
GRANITE_CHUNK_SIZE = 16
DECAY_MIN, DECAY_MAX = 0.01, 0.1

Init = Callable[[torch.nn.Module], None]


def build_gpt_oss(
    shape: dict[str, Any],
    generation_config: GenerationConfig,
    init: Init,
    out_dir: Path,
) -> None:
    """Two layers (windowed, full), four experts of which two per token."""
    config = GptOssConfig(
        **_text_shape(shape),
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=GPT_OSS_WINDOW,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 64,
        },
        dtype="float32",
    )
    model = GptOssForCausalLM(config)
    init(model)
    generator = torch.Generator().manual_seed(len(config.layer_types))
    for name, param in model.named_parameters():
        if name.endswith(".sinks"):
            noise = torch.randn(param.shape, generator=generator)
            param.data.copy_(noise * SINK_STD + SINK_MEAN)
        elif ".experts." in name and param.dim() == 3:
            param.data.mul_(GPT_OSS_EXPERT_STD / shape["initializer_range"])
    model.generation_config = generation_config
    model.save_pretrained(out_dir)


def build_llama4(
    shape: dict[str, Any],
    generation_config: GenerationConfig,
    init: Init,
    out_dir: Path,
) -> None:
    """Layer 0: rotary, chunked, dense MLP; layer 1: NoPE (global, temperature
    tuned), four experts of which one per token, and the shared expert."""
    model = Llama4ForCausalLM(llama4_text_config(shape))
    init(model)
    # vLLM reads the switch from the generation config (off below 32k tokens).
    generation_config.attn_temperature_tuning = True
    model.generation_config = generation_config
    model.save_pretrained(out_dir)


def llama4_text_config(shape: dict[str, Any]) -> Llama4TextConfig:
    """tiny-llama4's decoder (also the tiny Llama 4 with images')."""
    return Llama4TextConfig(
        **_text_shape(shape),
        intermediate_size_mlp=shape["intermediate_size"],
        num_local_experts=4,
        num_experts_per_tok=1,
        interleave_moe_layer_step=2,
        no_rope_layers=[1, 0],
        attention_chunk_size=CHUNK_SIZE,
        attn_temperature_tuning=True,
        floor_scale=FLOOR_SCALE,
        attn_scale=ATTN_SCALE,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        dtype="float32",
    )


def build_granite4_h(
    shape: dict[str, Any],
    generation_config: GenerationConfig,
    init: Init,
    out_dir: Path,
) -> None:
    """Mamba2, attention (NoPE, two heads of 32: the HPU attention's smallest
    head size), Mamba2, Mamba2; eight Mamba heads of 16 in one group, state 8,
    conv width 4; four experts of which two per token beside the shared MLP;
    Granite's embedding, attention, residual and logits multipliers."""
    config = GraniteMoeHybridConfig(
        **hybrid_shape(shape, GRANITE_LAYERS) | {"num_attention_heads": 2},
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        shared_intermediate_size=HYBRID_HIDDEN,
        mamba_n_heads=8,
        mamba_d_head=16,
        mamba_n_groups=1,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=GRANITE_CHUNK_SIZE,
        position_embedding_type="nope",
        embedding_multiplier=4.0,
        attention_multiplier=0.2,
        residual_multiplier=0.5,
        logits_scaling=2.0,
        dtype="float32",
    )
    save_hybrid(GraniteMoeHybridForCausalLM(config), generation_config, init, out_dir)


def build_qwen3_next(
    shape: dict[str, Any],
    generation_config: GenerationConfig,
    init: Init,
    out_dir: Path,
) -> None:
    """Three gated delta-net layers (two key heads of 16, four value heads of 16,
    conv width 4), then gated attention (four heads of 32 on two KV heads, rotary
    on a quarter of each head); four experts of which two per token beside the
    gated shared expert in every layer."""
    config = Qwen3NextConfig(
        **hybrid_shape(shape, QWEN3_NEXT_LAYERS),
        num_key_value_heads=2,
        head_dim=32,
        partial_rotary_factor=0.25,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=HYBRID_HIDDEN // 2,
        shared_expert_intermediate_size=HYBRID_HIDDEN // 2,
        dtype="float32",
    )
    save_hybrid(Qwen3NextForCausalLM(config), generation_config, init, out_dir)


def hybrid_shape(shape: dict[str, Any], layer_types: list[str]) -> dict[str, Any]:
    """The tiny Llama's vocabulary, positions and token ids; the hybrids' sizes
    (head sizes and KV heads are each builder's)."""
    kept = {k: v for k, v in shape.items() if k not in _PER_HYBRID}
    return {
        **kept,
        "hidden_size": HYBRID_HIDDEN,
        "intermediate_size": HYBRID_HIDDEN,
        "num_hidden_layers": len(layer_types),
        "layer_types": layer_types,
        "num_attention_heads": 4,
    }


_PER_HYBRID = ("head_dim", "num_key_value_heads")


def save_hybrid(
    model: PreTrainedModel,
    generation_config: GenerationConfig,
    init: Init,
    out_dir: Path,
) -> None:
    """Initialise, slow the state layers' decay (module comment), save."""
    init(model)
    num_layers = len(model.config.get_text_config().layer_types)
    generator = torch.Generator().manual_seed(num_layers)
    for name, param in model.named_parameters():
        if name.endswith("A_log"):
            rate = torch.empty(param.shape).uniform_(
                DECAY_MIN, DECAY_MAX, generator=generator
            )
            param.data.copy_(rate.log())
    model.generation_config = generation_config
    model.save_pretrained(out_dir)


def _text_shape(shape: dict[str, Any]) -> dict[str, Any]:
    """The decoder's sizes and token ids; experts of a quarter width."""
    return {
        **shape,
        "num_hidden_layers": 2,
        "intermediate_size": shape["intermediate_size"] // 4,
    }


FAMILY_BUILDERS = {
    "tiny-gpt-oss": build_gpt_oss,
    "tiny-llama4": build_llama4,
    "tiny-granite-4.0-h": build_granite4_h,
    "tiny-qwen3-next": build_qwen3_next,
}
