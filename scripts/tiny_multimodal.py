"""The tiny multimodal checkpoints build_tiny_models.py writes: a LLaVA-1.5 style
model (CLIP vision tower, MLP projector, the tiny Llama) with a local processor,
and a Mistral 3 (Pixtral tower, patch merger, a Mistral decoder) that the tests
run as a text model (every modality limited to 0).
"""

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import (
    CLIPImageProcessor,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    Mistral3Config,
    Mistral3ForConditionalGeneration,
    MistralConfig,
    PixtralImageProcessor,
    PixtralProcessor,
    PixtralVisionConfig,
    PreTrainedTokenizerFast,
)

IMAGE_TOKEN = "<image>"
# 56 x 56 pixels in 14-pixel patches: 16 image tokens per image (CLS dropped).
IMAGE_SIZE = 56
PATCH_SIZE = 14
VISION_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": IMAGE_SIZE,
    "patch_size": PATCH_SIZE,
    "projection_dim": 64,
}
# CLIP's own image statistics: the processor's defaults, written out so the
# checkpoint does not depend on them.
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
# A message's content may be a string or OpenAI-style parts (text, image).
LLAVA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>\\n' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def with_added_tokens(
    tokenizer: PreTrainedTokenizerFast, **extras: Any
) -> PreTrainedTokenizerFast:
    """The tiny tokenizer again over its backend, after a model's tokens were added
    to it past the text vocabulary; ``extras`` as PreTrainedTokenizerFast takes
    them (named special tokens, a chat template)."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer.backend_tokenizer,
        bos_token=tokenizer.bos_token,
        eos_token=tokenizer.eos_token,
        pad_token=tokenizer.pad_token,
        model_max_length=tokenizer.model_max_length,
        **extras,
    )


def restore_vision_model_prefix(weights: Path) -> None:
    """transformers 5 saves the CLIP tower's weights without its ``vision_model.``
    level (and reads them either way); LLaVA-1.5 checkpoints, and vLLM, have it."""
    tensors = load_file(weights)
    renamed = {
        re.sub(r"^vision_tower\.(?!vision_model\.)", "vision_tower.vision_model.", k): v
        for k, v in tensors.items()
    }
    save_file(renamed, weights, metadata={"format": "pt"})


def build_llava(
    text_shape: dict[str, Any],
    tokenizer: PreTrainedTokenizerFast,
    init: Callable[[torch.nn.Module], None],
    out_dir: Path,
) -> None:
    """LLaVA-1.5: the image token is one added token past the text vocabulary,
    which grows to the next multiple of 64 to hold it."""
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    vocab_size = -(-(image_token_id + 1) // 64) * 64
    ids = {
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(**VISION_SHAPE),
        text_config=LlamaConfig(**{**text_shape, "vocab_size": vocab_size}, **ids),
        image_token_index=image_token_id,
        image_seq_length=(IMAGE_SIZE // PATCH_SIZE) ** 2,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        projector_hidden_act="gelu",
        dtype="float32",
        **ids,
    )
    model = LlavaForConditionalGeneration(config).to(torch.float32)
    init(model)
    model.save_pretrained(out_dir)
    restore_vision_model_prefix(out_dir / "model.safetensors")
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE},
        crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        image_mean=CLIP_MEAN,
        image_std=CLIP_STD,
    )
    tokenizer.chat_template = LLAVA_CHAT_TEMPLATE
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,
        chat_template=LLAVA_CHAT_TEMPLATE,
    )
    processor.save_pretrained(out_dir)


PIXTRAL_TOKENS = ["[IMG]", "[IMG_BREAK]", "[IMG_END]"]
PIXTRAL_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "head_dim": 32,
    "image_size": 112,
    "patch_size": PATCH_SIZE,
}


def build_mistral3(
    text_shape: dict[str, Any],
    tokenizer: PreTrainedTokenizerFast,
    init: Callable[[torch.nn.Module], None],
    out_dir: Path,
) -> None:
    """Mistral 3 (Mistral Small 3.1's layout), untied embeddings as it ships."""
    tokenizer.add_special_tokens({"additional_special_tokens": PIXTRAL_TOKENS})
    vocab_size = -(-(len(tokenizer)) // 64) * 64
    ids = {
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    text = {**text_shape, "vocab_size": vocab_size, "sliding_window": None}
    config = Mistral3Config(
        vision_config=PixtralVisionConfig(**PIXTRAL_SHAPE),
        text_config=MistralConfig(**text, **ids, tie_word_embeddings=False),
        image_token_index=tokenizer.convert_tokens_to_ids(PIXTRAL_TOKENS[0]),
        spatial_merge_size=2,
        tie_word_embeddings=False,
        dtype="float32",
        **ids,
    )
    model = Mistral3ForConditionalGeneration(config).to(torch.float32)
    init(model)
    model.save_pretrained(out_dir)
    image_processor = PixtralImageProcessor(
        size={"longest_edge": PIXTRAL_SHAPE["image_size"]},
        patch_size=PATCH_SIZE,
        image_mean=CLIP_MEAN,
        image_std=CLIP_STD,
    )
    processor = PixtralProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        spatial_merge_size=2,
    )
    processor.save_pretrained(out_dir)
