"""The tiny Qwen2.5-VL and Qwen3-VL checkpoints build_tiny_models.py writes, with
transformers' own config classes and processors, sized so that each tower's
features bind on the tests' small images:

- Qwen2.5-VL: windowed vision attention in 2 x 2-token windows (images of 3 x 4
  tokens span several windows and get reordered) with one full-attention block;
- Qwen3-VL: deepstack features of two vision blocks added to both decoder layers,
  interleaved M-RoPE, learned position embeddings interpolated to each grid.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tiny_qwen2_vl import (
    CHAT_TEMPLATE,
    IMAGE_MEAN,
    IMAGE_PAD,
    IMAGE_STD,
    MERGE_SIZE,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
    mrope_section,
)
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2VLImageProcessor,
    Qwen2VLVideoProcessor,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
)

Init = Callable[[torch.nn.Module], None]

QWEN2_5_PATCH = 14
# 56 pixels = 2 x 2 merged tokens per window (112 in the real models: 4 x 4).
QWEN2_5_WINDOW = 56
QWEN2_5_VISION = {
    "depth": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 2,
    "patch_size": QWEN2_5_PATCH,
    "spatial_merge_size": MERGE_SIZE,
    "temporal_patch_size": 2,
    "window_size": QWEN2_5_WINDOW,
    "fullatt_block_indexes": [1],
}
QWEN3_PATCH = 16
QWEN3_VISION = {
    "depth": 3,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 2,
    "patch_size": QWEN3_PATCH,
    "spatial_merge_size": MERGE_SIZE,
    "temporal_patch_size": 2,
    # An 8 x 8 grid of learned positions, interpolated to each image's grid.
    "num_position_embeddings": 64,
    # Added to the outputs of decoder layers 0 and 1.
    "deepstack_visual_indexes": [0, 2],
}
QWEN3_MEAN = QWEN3_STD = [0.5, 0.5, 0.5]


def _vision_tokens(tokenizer: PreTrainedTokenizerFast) -> tuple[int, dict[str, int]]:
    """Adds the vision tokens past the text vocabulary: the vocabulary size (the
    next multiple of 64) and the special token ids."""
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]}
    )
    vocab_size = -(-(len(tokenizer)) // 64) * 64
    ids = {
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    return vocab_size, ids


def _vision_token_ids(tokenizer: PreTrainedTokenizerFast) -> dict[str, int]:
    token_id = tokenizer.convert_tokens_to_ids
    return {
        "image_token_id": token_id(IMAGE_PAD),
        "video_token_id": token_id(VIDEO_PAD),
        "vision_start_token_id": token_id(VISION_START),
        "vision_end_token_id": token_id(VISION_END),
    }


def _text_config(
    text_shape: dict[str, Any], vocab_size: int, ids: dict[str, int], **rope: Any
) -> dict[str, Any]:
    head_dim = text_shape["hidden_size"] // text_shape["num_attention_heads"]
    return {
        **text_shape,
        **ids,
        "vocab_size": vocab_size,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": mrope_section(head_dim),
            **rope,
        },
    }


def _save(model: torch.nn.Module, init: Init, processor: Any, out_dir: Path) -> None:
    model = model.to(torch.float32)
    init(model)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)


def _processor_kwargs(patch_size: int, mean: list[float], std: list[float]) -> dict:
    """One image token per (2 * patch_size) pixels squared: from 2 x 2 tokens to
    4 x 4, so images of different sizes give different token counts."""
    side = MERGE_SIZE * patch_size
    size = {"shortest_edge": (2 * side) ** 2, "longest_edge": (4 * side) ** 2}
    return {
        "size": size,
        "patch_size": patch_size,
        "merge_size": MERGE_SIZE,
        "image_mean": mean,
        "image_std": std,
    }


def build_qwen2_5_vl(
    text_shape: dict[str, Any],
    tokenizer: PreTrainedTokenizerFast,
    init: Init,
    out_dir: Path,
) -> None:
    vocab_size, ids = _vision_tokens(tokenizer)
    text = _text_config(text_shape, vocab_size, ids)
    text.pop("head_dim", None)
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config={**QWEN2_5_VISION, "out_hidden_size": text_shape["hidden_size"]},
        **_vision_token_ids(tokenizer),
        dtype="float32",
        **ids,
    )
    common = _processor_kwargs(QWEN2_5_PATCH, IMAGE_MEAN, IMAGE_STD)
    tokenizer.chat_template = CHAT_TEMPLATE
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(**common),
        video_processor=Qwen2VLVideoProcessor(**common),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )
    _save(Qwen2_5_VLForConditionalGeneration(config), init, processor, out_dir)


def build_qwen3_vl(
    text_shape: dict[str, Any],
    tokenizer: PreTrainedTokenizerFast,
    init: Init,
    out_dir: Path,
) -> None:
    vocab_size, ids = _vision_tokens(tokenizer)
    text = _text_config(text_shape, vocab_size, ids, mrope_interleaved=True)
    config = Qwen3VLConfig(
        text_config=text,
        vision_config={**QWEN3_VISION, "out_hidden_size": text_shape["hidden_size"]},
        **_vision_token_ids(tokenizer),
        dtype="float32",
        **ids,
    )
    common = _processor_kwargs(QWEN3_PATCH, QWEN3_MEAN, QWEN3_STD)
    tokenizer.chat_template = CHAT_TEMPLATE
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(**common),
        video_processor=Qwen3VLVideoProcessor(**common),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )
    _save(Qwen3VLForConditionalGeneration(config), init, processor, out_dir)
