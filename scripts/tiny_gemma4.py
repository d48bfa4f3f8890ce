"""The tiny Gemma 4 build_tiny_models.py writes (Gemma4ForCausalLM), from
transformers' own Gemma4TextConfig, with each of the family's pieces switched
on in one five-layer decoder: windowed and global layers (the window not a
multiple of 16-token blocks), wider global heads with proportional partial
rotary and keys reused as values, the last two layers reading the KV cache of
the last earlier layer of their kind, per-layer input embeddings, a
double-wide MLP in the KV-sharing layers, experts beside the dense MLP, and the
final logit soft-cap. With images (Gemma4ForConditionalGeneration): the same
decoder behind a two-layer vision tower, its image tokens longer than the
window and attending both ways in the windowed layers, with Gemma 4's own
processor; no audio tower.
"""

from pathlib import Path
from typing import Any

import torch
from tiny_families import Init
from tiny_multimodal import with_added_tokens
from transformers import (
    Gemma4AudioFeatureExtractor,
    Gemma4Config,
    Gemma4ForCausalLM,
    Gemma4ForConditionalGeneration,
    Gemma4ImageProcessor,
    Gemma4Processor,
    Gemma4TextConfig,
    Gemma4VideoProcessor,
    GenerationConfig,
    PreTrainedTokenizerFast,
)

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


# ---- Gemma 4 with images (Gemma4ForConditionalGeneration) --------------------
BOI, IMAGE, EOI = "<|image>", "<|image|>", "<image|>"
# The processor checks for audio's markers even without audio inputs.
BOA, AUDIO, EOA = "<|audio>", "<|audio|>", "<audio|>"
# 4-pixel patches pooled 2 x 2, at most 70 image tokens (Gemma 4's smallest
# budget): the test images take 63 and 66, longer than the 40-token window.
GEMMA4_PATCH = 4
GEMMA4_POOLING = 2
GEMMA4_SOFT_TOKENS = 70
GEMMA4_VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "patch_size": GEMMA4_PATCH,
    "pooling_kernel_size": GEMMA4_POOLING,
    "position_embedding_size": 128,
    # vLLM reads the image budget from here (real checkpoints carry it).
    "default_output_length": GEMMA4_SOFT_TOKENS,
}


def _gemma4_tokenizer(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """The tiny tokenizer with Gemma 4's image and audio markers, named as its
    processor reads them, past the text vocabulary."""
    backend = tokenizer.backend_tokenizer
    backend.add_special_tokens([BOI, IMAGE, EOI, BOA, AUDIO, EOA])
    names = {
        "boi_token": BOI,
        "image_token": IMAGE,
        "eoi_token": EOI,
        "boa_token": BOA,
        "audio_token": AUDIO,
        "eoa_token": EOA,
    }
    return with_added_tokens(tokenizer, extra_special_tokens=names)


def build_gemma4_vl(
    text_shape: dict[str, Any],
    tokenizer: PreTrainedTokenizerFast,
    init: Init,
    out_dir: Path,
) -> None:
    """The tiny Gemma 4's decoder behind a two-layer vision tower, its image
    tokens attending both ways in the windowed layers (use_bidirectional_attention
    "vision"); no audio tower."""
    tokenizer = _gemma4_tokenizer(tokenizer)
    token_id = tokenizer.convert_tokens_to_ids
    # The processor adds a video token: room for it in the vocabulary.
    vocab_size = -(-(len(tokenizer) + 1) // 64) * 64
    ids = {
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    text = gemma4_text_config({**text_shape, **ids, "vocab_size": vocab_size})
    text.use_bidirectional_attention = "vision"
    config = Gemma4Config(
        text_config=text.to_dict(),
        vision_config=GEMMA4_VISION,
        audio_config=None,
        boi_token_id=token_id(BOI),
        eoi_token_id=token_id(EOI),
        image_token_id=token_id(IMAGE),
        boa_token_id=token_id(BOA),
        eoa_token_index=token_id(EOA),
        audio_token_id=token_id(AUDIO),
        video_token_id=len(tokenizer),
        dtype="float32",
        **ids,
    )
    model = Gemma4ForConditionalGeneration(config)
    init(model)
    scale_routers(model)
    model.generation_config = GenerationConfig(**ids)
    model.save_pretrained(out_dir)
    _gemma4_processor(tokenizer).save_pretrained(out_dir)


def _gemma4_processor(tokenizer: PreTrainedTokenizerFast) -> Gemma4Processor:
    images = {
        "patch_size": GEMMA4_PATCH,
        "pooling_kernel_size": GEMMA4_POOLING,
        "max_soft_tokens": GEMMA4_SOFT_TOKENS,
    }
    return Gemma4Processor(
        feature_extractor=Gemma4AudioFeatureExtractor(),
        image_processor=Gemma4ImageProcessor(**images),
        video_processor=Gemma4VideoProcessor(**images),
        tokenizer=tokenizer,
        image_seq_length=GEMMA4_SOFT_TOKENS,
    )
