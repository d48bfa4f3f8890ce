"""Llama 4 with images (tiled vision tower, 2-D vision rotary, pixel shuffle,
projector; chunked local attention in the decoder) through encoder passes
bucketed by tiles: images of two sizes (3 and 5 tiles) and a text-only prompt in
one batch, then two images in one prompt, equal transformers token for token
(float32). Prompts run in chunks of CHUNK tokens, the first ending inside the
image tokens, and cross the decoder's attention chunk. The engine is compiled
(dynamo's eager backend; warmup runs every tile bucket) and compiles nothing
after warmup. The reference changes
with the image's pixels, so the checks see the tower's output."""

from functools import cache, partial
from typing import Any

import numpy as np
import torch
from models import model_path
from PIL import Image
from vllm import LLM

from e2e.harness import (
    DEFAULT_ENGINE,
    SENDS_CALLABLES,
    engine_spec,
    uses_engines,
    vllm_greedy_with_images,
)

MODEL = "tiny-llama4-vision"
MAX_TOKENS = 8
SHORT = "USER: <|image|>What is in the picture? ASSISTANT:"
TEXT_ONLY = "USER: What is in the picture? ASSISTANT:"
TWO_IMAGES = "USER: <|image|> and <|image|> Which is brighter? ASSISTANT:"
# Pixels (height, width) -> tiles of 32 pixels: 1 x 2 (and the global tile),
# 2 x 2 (and the global tile), 1 x 2 again with other pixels.
SIZES = {1: (30, 40), 2: (64, 70), 3: (30, 40)}
CHUNK = 16
ATTENTION_CHUNK = 40  # tiny-llama4's attention_chunk_size

BLOCK = 16
COMPILED = engine_spec(
    MODEL,
    name="llama4-images-compiled",
    enforce_eager=False,
    block_size=BLOCK,
    max_model_len=96,
    enable_chunked_prefill=True,
    max_num_batched_tokens=CHUNK,
    max_num_seqs=3,
    limit_mm_per_prompt={"image": 2},
    # Prompt passes of 16 tokens with up to 8 context blocks (two prompts of
    # three blocks merged in one pass), decodes of 1 to 3 sequences; warmup
    # runs the encoder's tile buckets too.
    env={
        # vLLM's default engine: its core in its own process, which counts the
        # graphs it compiled (_compilations, a callable sent to it).
        **DEFAULT_ENGINE,
        **SENDS_CALLABLES,
        "VLLM_HPU_COMPILE_BACKEND": "eager",
        "VLLM_PROMPT_SEQ_BUCKET_MIN": str(CHUNK),
        "VLLM_PROMPT_SEQ_BUCKET_STEP": str(CHUNK),
        "VLLM_PROMPT_SEQ_BUCKET_MAX": str(CHUNK),
        "VLLM_PROMPT_BLOCK_BUCKET_MAX": "8",
    },
)
Requests = tuple[tuple[str, tuple[int, ...]], ...]


@cache
def image(seed: int) -> Image.Image:
    height, width = SIZES[seed]
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3))
    return Image.fromarray(pixels.astype(np.uint8))


@cache
def processor() -> Any:
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model_path(MODEL))


@cache
def expected(requests: Requests) -> list[list[int]]:
    """transformers' greedy tokens for each (prompt, image seeds)."""
    from transformers import AutoModelForImageTextToText

    hf = AutoModelForImageTextToText.from_pretrained(
        model_path(MODEL), dtype=torch.float32
    ).eval()
    return [_hf_greedy(hf, prompt, seeds) for prompt, seeds in requests]


@torch.no_grad()
def _hf_greedy(hf: Any, prompt: str, seeds: tuple[int, ...]) -> list[int]:
    images = [image(s) for s in seeds] or None
    inputs = processor()(text=prompt, images=images, return_tensors="pt")
    if images:
        # Llama 4's image processor normalizes in bfloat16; vLLM casts the
        # pixels to the model's dtype, as here.
        inputs["pixel_values"] = inputs["pixel_values"].float()
    output = hf.generate(
        **inputs, max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=[]
    )
    return output[0, inputs["input_ids"].shape[1] :].tolist()


vllm_greedy = partial(vllm_greedy_with_images, image=image, max_tokens=MAX_TOKENS)


def _layout(seed: int) -> tuple[int, list[int], int]:
    """(tiles, positions of the image tokens, prompt length) of SHORT with
    ``image(seed)``."""
    inputs = processor()(text=SHORT, images=[image(seed)], return_tensors="pt")
    patch = processor().tokenizer.convert_tokens_to_ids("<|patch|>")
    ids = inputs["input_ids"][0].tolist()
    image_tokens = [i for i, t in enumerate(ids) if t == patch]
    return len(inputs["pixel_values"]), image_tokens, len(ids)


def _compilations(llm: LLM) -> int:
    """Graphs compiled in the engine's process (its core runs apart)."""
    (count,) = llm.collective_rpc(_compiled_here)
    return count


def _compiled_here(worker: object) -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@uses_engines(COMPILED)
def test_llama4_images_match_transformers_in_chunks(llm: LLM) -> None:
    tiles, image_tokens, length = _layout(1)
    assert (tiles, _layout(2)[0]) == (3, 5)
    # The first chunk ends inside the image; the prompt crosses an attention chunk.
    assert image_tokens[0] < CHUNK <= image_tokens[-1] < ATTENTION_CHUNK < length
    batches: list[Requests] = [
        ((SHORT, (1,)), (SHORT, (2,)), (TEXT_ONLY, ())),
        ((TWO_IMAGES, (1, 2)), (TWO_IMAGES, (2, 1))),
    ]
    warmed = _compilations(llm)
    for requests in batches:
        outputs = vllm_greedy(llm, requests)
        assert outputs == expected(requests)
        assert outputs[0] != outputs[1]
    assert warmed > 0 and _compilations(llm) == warmed
    # Other pixels of the same size give other tokens.
    assert expected(((SHORT, (3,)),)) != expected(((SHORT, (1,)),))
