"""The tiny Llama 4 with images build_tiny_models.py writes
(Llama4ForConditionalGeneration): tiny-llama4's decoder (chunked attention, a NoPE
layer, a top-1 expert beside the shared one) and a Llama 4 vision tower, built
with transformers' own config classes and processor.

An image is resized to a grid of up to MAX_TILES tiles of TILE_SIZE pixels; a
grid of several tiles also gets a global tile (the whole image at one tile's
size). Each tile's 4 x 4 patches (and a CLS token) attend to each other with
the tower's 2-D rotary embedding; pixel shuffle folds 2 x 2 patches into one of
TOKENS_PER_TILE image tokens.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tiny_families import llama4_text_config
from tiny_multimodal import with_added_tokens
from tokenizers import AddedToken
from transformers import (
    GenerationConfig,
    Llama4Config,
    Llama4ForConditionalGeneration,
    Llama4ImageProcessor,
    Llama4Processor,
    Llama4VisionConfig,
    PreTrainedTokenizerFast,
)

# Llama4Processor's own token names (its defaults).
IMAGE, IMAGE_START, IMAGE_END, PATCH = (
    "<|image|>",
    "<|image_start|>",
    "<|image_end|>",
    "<|patch|>",
)
TILE_X, TILE_Y = "<|tile_x_separator|>", "<|tile_y_separator|>"
IMAGE_TOKENS = [IMAGE, IMAGE_START, IMAGE_END, PATCH, TILE_X, TILE_Y]
TILE_SIZE = 32  # pixels
PATCH_SIZE = 8  # 4 x 4 patches per tile
PIXEL_SHUFFLE_RATIO = 0.5
TOKENS_PER_TILE = 4
MAX_TILES = 4  # grids of 1 x 1 to 4 x 1 tiles (vLLM's largest image is 4 x 1)
VISION_HIDDEN = 64
VISION_SHAPE = {
    "hidden_size": VISION_HIDDEN,
    # Pixel shuffle's output: 2 x 2 patches' features side by side.
    "intermediate_size": int(VISION_HIDDEN / PIXEL_SHUFFLE_RATIO**2),
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": TILE_SIZE,
    "patch_size": PATCH_SIZE,
    "pixel_shuffle_ratio": PIXEL_SHUFFLE_RATIO,
    "projector_input_dim": VISION_HIDDEN,
    "projector_output_dim": VISION_HIDDEN,
    "vision_output_dim": VISION_HIDDEN,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}
# The tiny tokenizer's chat format; an image part becomes Llama 4's placeholder.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|image|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _with_image_tokens(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """The tiny tokenizer with Llama 4's image tokens past the text vocabulary."""
    backend = tokenizer.backend_tokenizer
    backend.add_special_tokens([AddedToken(t, normalized=False) for t in IMAGE_TOKENS])
    return with_added_tokens(tokenizer, chat_template=CHAT_TEMPLATE)


def build_llama4_vision(
    text_shape: dict[str, Any],
    tokenizer: PreTrainedTokenizerFast,
    init: Callable[[torch.nn.Module], None],
    out_dir: Path,
) -> None:
    tokenizer = _with_image_tokens(tokenizer)
    token_id = tokenizer.convert_tokens_to_ids
    ids = {
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    vocab_size = -(-len(tokenizer) // 64) * 64
    config = Llama4Config(
        text_config=llama4_text_config({**text_shape, **ids, "vocab_size": vocab_size}),
        vision_config=Llama4VisionConfig(**VISION_SHAPE),
        boi_token_index=token_id(IMAGE_START),
        eoi_token_index=token_id(IMAGE_END),
        image_token_index=token_id(PATCH),
        dtype="float32",
        **ids,
    )
    model = Llama4ForConditionalGeneration(config)
    init(model)
    # vLLM reads the switch from the generation config (off below 32k tokens).
    model.generation_config = GenerationConfig(
        **{**ids, "eos_token_id": [ids["eos_token_id"], token_id("<|im_end|>")]},
        attn_temperature_tuning=True,
    )
    model.save_pretrained(out_dir)
    image_processor = Llama4ImageProcessor(
        size={"height": TILE_SIZE, "width": TILE_SIZE}, max_patches=MAX_TILES
    )
    processor = Llama4Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        pixel_shuffle_ratio=PIXEL_SHUFFLE_RATIO,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(out_dir)
