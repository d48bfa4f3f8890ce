"""The tiny Gemma 3 checkpoint build_tiny_models.py writes: a SigLIP tower whose 8 x 8
patches are average-pooled to 4 x 4 image tokens, and a Gemma 3 decoder with a
windowed and a full layer, built with transformers' own config classes and
processor (pan-and-scan off, as it ships). Untied embeddings: tied, the tiny
model's scaled input embedding dominates its logits and it repeats its last
token whatever it sees. Its image tokens attend to each other
both ways in the decoder; the window holds a whole image, as in the real models
(256 image tokens, windows of 512 or 1024).
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tiny_multimodal import restore_vision_model_prefix, with_added_tokens
from tokenizers import AddedToken
from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3ImageProcessor,
    Gemma3Processor,
    PreTrainedTokenizerFast,
    SiglipVisionConfig,
)

BOI, IMAGE, EOI = "<start_of_image>", "<image_soft_token>", "<end_of_image>"
# Gemma's tokenizer has runs of newlines as single tokens; vLLM's Gemma 3
# processor looks them up to merge the newlines around an image.
NEWLINES = ["\n", "\n\n", "\n\n\n", "\n\n\n\n"]
IMAGE_SIZE = 112  # pixels; every image is resized to it (no pan-and-scan)
PATCH_SIZE = 14
TOKENS_PER_IMAGE = 16  # 4 x 4, pooled from 8 x 8 patches
SLIDING_WINDOW = 48
VISION_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": IMAGE_SIZE,
    "patch_size": PATCH_SIZE,
    "vision_use_head": False,
}
GEMMA_MEAN = GEMMA_STD = [0.5, 0.5, 0.5]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<start_of_image>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _gemma_tokenizer(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """The tiny tokenizer with Gemma 3's image tokens (named as its processor
    reads them) and newline runs, past the text vocabulary."""
    backend = tokenizer.backend_tokenizer
    backend.add_tokens([AddedToken(text, normalized=False) for text in NEWLINES])
    backend.add_special_tokens([BOI, IMAGE, EOI])
    names = {"boi_token": BOI, "image_token": IMAGE, "eoi_token": EOI}
    return with_added_tokens(tokenizer, extra_special_tokens=names)


def build_gemma3(
    text_shape: dict[str, Any],
    tokenizer: PreTrainedTokenizerFast,
    init: Callable[[torch.nn.Module], None],
    out_dir: Path,
) -> None:
    tokenizer = _gemma_tokenizer(tokenizer)
    token_id = tokenizer.convert_tokens_to_ids
    vocab_size = -(-(len(tokenizer)) // 64) * 64
    ids = {
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    text = {
        **text_shape,
        **ids,
        "vocab_size": vocab_size,
        "sliding_window": SLIDING_WINDOW,
        "layer_types": ["sliding_attention", "full_attention"],
        "query_pre_attn_scalar": text_shape["head_dim"],
        "tie_word_embeddings": False,
    }
    config = Gemma3Config(
        text_config=text,
        vision_config=SiglipVisionConfig(**VISION_SHAPE),
        mm_tokens_per_image=TOKENS_PER_IMAGE,
        boi_token_index=token_id(BOI),
        eoi_token_index=token_id(EOI),
        image_token_index=token_id(IMAGE),
        tie_word_embeddings=False,
        dtype="float32",
        **ids,
    )
    model = Gemma3ForConditionalGeneration(config).to(torch.float32)
    init(model)
    model.save_pretrained(out_dir)
    restore_vision_model_prefix(out_dir / "model.safetensors")
    image_processor = Gemma3ImageProcessor(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        image_mean=GEMMA_MEAN,
        image_std=GEMMA_STD,
        do_pan_and_scan=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    processor = Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_length=TOKENS_PER_IMAGE,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(out_dir)
