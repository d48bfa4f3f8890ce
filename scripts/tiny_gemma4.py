"""The tiny Gemma 4 build_tiny_models.py writes (Gemma4ForCausalLM), from
transformers' own Gemma4TextConfig, with each of the family's pieces switched
on in one five-layer decoder: windowed and global layers (the window not a
multiple of 16-token blocks), wider global heads with proportional partial
rotary and keys reused as values, the last two layers reading the KV cache of
the last earlier layer of their kind, per-layer input embeddings, a
double-wide MLP in the KV-sharing layers, experts beside the dense MLP, and the
final logit soft-cap.
"""

from pathlib import Path
from typing import Any

import torch
from tiny_families import Init
from transformers import Gemma4ForCausalLM, Gemma4TextConfig, GenerationConfig

GEMMA4_WINDOW = 40
# Layers 3 and 4 share: layer 3 (windowed) reads layer 2's cache, layer 4
# (global) layer 1's.
GEMMA4_LAYERS = [
    "sliding_attention",
    "full_attention",
    "sliding_attention",
    "sliding_attention",
    "full_attention",
]
GEMMA4_KV_SHARED_LAYERS = 2
GEMMA4_HIDDEN = 64
# Gemma 4's own global head size (its windowed layers' heads are half as wide).
GEMMA4_GLOBAL_HEAD = 512
_PER_GEMMA4 = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)


def gemma4_text_config(shape: dict[str, Any]) -> Gemma4TextConfig:
    """The decoder of the tiny Gemma 4 (also the tiny Gemma 4 with images')."""
    kept = {k: v for k, v in shape.items() if k not in _PER_GEMMA4}
    return Gemma4TextConfig(
        **kept,
        hidden_size=GEMMA4_HIDDEN,
        intermediate_size=2 * GEMMA4_HIDDEN,
        num_hidden_layers=len(GEMMA4_LAYERS),
        layer_types=GEMMA4_LAYERS,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        global_head_dim=GEMMA4_GLOBAL_HEAD,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        sliding_window=GEMMA4_WINDOW,
        num_kv_shared_layers=GEMMA4_KV_SHARED_LAYERS,
        use_double_wide_mlp=True,
        vocab_size_per_layer_input=shape["vocab_size"],
        hidden_size_per_layer_input=16,
        enable_moe_block=True,
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=GEMMA4_HIDDEN // 2,
        final_logit_softcapping=30.0,
        tie_word_embeddings=True,
        dtype="float32",
    )


def build_gemma4(
    shape: dict[str, Any],
    generation_config: GenerationConfig,
    init: Init,
    out_dir: Path,
) -> None:
    model = Gemma4ForCausalLM(gemma4_text_config(shape))
    init(model)
    scale_routers(model)
    model.generation_config = generation_config
    model.save_pretrained(out_dir)


def scale_routers(model: torch.nn.Module) -> None:
    """Router input scales that undo its 1/sqrt(hidden) factor, so that expert
    scores spread by about one unit (no near-ties decide the top 2), and
    per-expert output scales around 1 (drawn near 0, as biases are, the experts
    would add almost nothing)."""
    generator = torch.Generator().manual_seed(len(GEMMA4_LAYERS))
    for name, param in model.named_parameters():
        if name.endswith("router.scale"):
            param.data.fill_(GEMMA4_HIDDEN**0.5)
        elif name.endswith("router.per_expert_scale"):
            param.data.uniform_(0.5, 1.5, generator=generator)


GEMMA4_BUILDERS = {"tiny-gemma4": build_gemma4}
