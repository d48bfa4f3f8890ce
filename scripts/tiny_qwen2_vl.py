"""The tiny Qwen2-VL checkpoint build_tiny_models.py writes: Qwen2-VL's vision
transformer (dynamic resolution: any image size, in 14-pixel patches merged 2 x 2
into one token) and a Qwen2 decoder with M-RoPE, with a local processor.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessor,
    Qwen2VLProcessor,
    Qwen2VLVideoProcessor,
)

VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = (
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
PATCH_SIZE = 14
MERGE_SIZE = 2
# One image token per 28 x 28 pixels: from 4 tokens (56 x 56) to 16 (112 x 112),
# so images of different sizes give different token and patch counts.
MIN_PIXELS = 56 * 56
MAX_PIXELS = 112 * 112
VISION_SHAPE = {
    "depth": 2,
    "embed_dim": 64,
    "num_heads": 2,
    "mlp_ratio": 2,
    "patch_size": PATCH_SIZE,
    "spatial_merge_size": MERGE_SIZE,
    "temporal_patch_size": 2,
}
# Qwen2-VL's statistics (OpenAI CLIP's), written out so the checkpoint does not
# depend on the processor's defaults.
IMAGE_MEAN = [0.48145466, 0.4578275, 0.40821073]
IMAGE_STD = [0.26862954, 0.26130258, 0.27577711]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def mrope_section(head_dim: int) -> list[int]:
    """Rotary frequencies (head_dim / 2) for the (time, height, width) positions:
    Qwen2-VL's 2 : 3 : 3 split ([16, 24, 24] at head_dim 128)."""
    unit = head_dim // 16
    return [unit * 2, unit * 3, unit * 3]


def build_qwen2_vl(
    text_shape: dict[str, Any],
    tokenizer: PreTrainedTokenizerFast,
    init: Callable[[torch.nn.Module], None],
    out_dir: Path,
) -> None:
    """The vision tokens are added past the text vocabulary, which grows to the
    next multiple of 64 to hold them."""
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]}
    )
    token_id = tokenizer.convert_tokens_to_ids
    vocab_size = -(-(len(tokenizer)) // 64) * 64
    ids = {
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    head_dim = text_shape["hidden_size"] // text_shape["num_attention_heads"]
    text = {k: v for k, v in text_shape.items() if k != "head_dim"}
    config = Qwen2VLConfig(
        text_config={
            **text,
            **ids,
            "vocab_size": vocab_size,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": mrope_section(head_dim),
            },
        },
        vision_config={**VISION_SHAPE, "hidden_size": text_shape["hidden_size"]},
        image_token_id=token_id(IMAGE_PAD),
        video_token_id=token_id(VIDEO_PAD),
        vision_start_token_id=token_id(VISION_START),
        vision_end_token_id=token_id(VISION_END),
        dtype="float32",
        **ids,
    )
    model = Qwen2VLForConditionalGeneration(config).to(torch.float32)
    init(model)
    model.save_pretrained(out_dir)
    size = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    common = {
        "size": size,
        "patch_size": PATCH_SIZE,
        "merge_size": MERGE_SIZE,
        "image_mean": IMAGE_MEAN,
        "image_std": IMAGE_STD,
    }
    tokenizer.chat_template = CHAT_TEMPLATE
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(**common),
        video_processor=Qwen2VLVideoProcessor(**common),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(out_dir)
