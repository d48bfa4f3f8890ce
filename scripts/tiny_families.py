"""The tiny gpt-oss and Llama 4 (text) checkpoints build_tiny_models.py writes, made
with transformers' own config classes, and sized so that each family's features
bind on prompts of a few dozen tokens: gpt-oss's attention sinks, alternating
sliding window, biased experts with the clamped SwiGLU; Llama 4's chunked local
attention, NoPE layer with attention temperature tuning and top-1 experts weighted
on their input beside a shared expert.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import (
    GenerationConfig,
    GptOssConfig,
    GptOssForCausalLM,
    Llama4ForCausalLM,
    Llama4TextConfig,
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


def _text_shape(shape: dict[str, Any]) -> dict[str, Any]:
    """The decoder's sizes and token ids; experts of a quarter width."""
    return {
        **shape,
        "num_hidden_layers": 2,
        "intermediate_size": shape["intermediate_size"] // 4,
    }


FAMILY_BUILDERS = {"tiny-gpt-oss": build_gpt_oss, "tiny-llama4": build_llama4}
