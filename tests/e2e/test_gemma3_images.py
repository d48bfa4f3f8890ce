"""Gemma 3 with images (SigLIP tower, pan-and-scan off): images of two sizes and a
text-only prompt in one batch, then two images in one prompt, equal transformers
token for token (float32). Each image's tokens attend to each other both ways
(vLLM's mm prefix ranges): prompts run in chunks of at most CHUNK tokens, with
context, and the two-image prompt hits the cached first block of
an earlier prompt, which ends inside its first image. The engine is compiled
(dynamo's eager backend) and compiles nothing after warmup. The reference with
causal image attention gives other tokens, so the test checks the spans."""

from typing import Any

import torch
from vllm import LLM

from e2e.harness import compiled_graphs, counted, counters, engine_spec, uses_engines
from e2e.test_qwen_vl import (
    MAX_TOKENS,
    Requests,
    expected,
    hf_model,
    image,
    processor,
    vllm_greedy,
)

MODEL = "tiny-gemma3"
IMAGE = "<start_of_image>"
SHORT = f"USER: {IMAGE}What is in the picture? ASSISTANT:"
TEXT_ONLY = "USER: What is in the picture? ASSISTANT:"
TWO_IMAGES = f"USER: {IMAGE} and {IMAGE} Which is brighter? ASSISTANT:"
BLOCK = 16
# Steps of at most CHUNK tokens: prompts run in two or three chunks, each image
# (20 tokens with its newlines and markers) within one. (vLLM 0.32's scheduler
# keeps an image whole only when the chunk starts before it: one starting on
# its first token with less budget left splits it, and the first part then
# attends to the first part only, on any platform.)
CHUNK = 40

IMAGES = engine_spec(
    MODEL,
    name="gemma3-images-compiled",
    enforce_eager=False,
    block_size=BLOCK,
    max_model_len=96,
    enable_chunked_prefill=True,
    max_num_batched_tokens=CHUNK,
    max_num_seqs=3,
    limit_mm_per_prompt={"image": 2},
    # Prompt passes of 64 tokens with up to 4 context blocks (chunks after the
    # first, and the prefix hit), and decodes of 1 to 3 sequences.
    env={
        "VLLM_HPU_COMPILE_BACKEND": "eager",
        "VLLM_PROMPT_SEQ_BUCKET_MIN": "64",
        "VLLM_PROMPT_SEQ_BUCKET_STEP": "64",
        "VLLM_PROMPT_SEQ_BUCKET_MAX": "64",
        "VLLM_PROMPT_BLOCK_BUCKET_MAX": "4",
    },
)


@uses_engines(IMAGES)
def test_gemma3_images_match_transformers(llm: LLM) -> None:
    gemma3 = processor(MODEL)
    ids = gemma3(text=SHORT, images=[image(1)])["input_ids"][0]
    image_tokens = [
        i for i, t in enumerate(ids) if t == gemma3.tokenizer.image_token_id
    ]
    # The cached first block holds part of the first image only.
    assert image_tokens[0] < BLOCK <= image_tokens[-1] < CHUNK < len(ids)
    batches: list[Requests] = [
        [(SHORT, (1,)), (SHORT, (2,)), (TEXT_ONLY, ())],
        [(TWO_IMAGES, (1, 2))],
    ]
    before, warmed = counters(llm), compiled_graphs()
    outputs = [vllm_greedy(llm, requests) for requests in batches]
    assert outputs == [expected(MODEL, tuple(requests)) for requests in batches]
    assert counted(before, counters(llm), "vllm:prefix_cache_hits") >= BLOCK
    # Span ends in every prompt pass: no graph of another input structure.
    assert warmed > 0 and compiled_graphs() == warmed


@torch.no_grad()
def _hf_causal_greedy(hf: Any, prompt: str, seed: int) -> list[int]:
    """transformers' greedy tokens with causal attention over the image tokens
    (no token types: nothing marks them as one image)."""
    inputs = processor(MODEL)(text=prompt, images=[image(seed)], return_tensors="pt")
    del inputs["token_type_ids"]
    output = hf.generate(
        **inputs, max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=[]
    )
    return output[0, inputs["input_ids"].shape[1] :].tolist()


def test_gemma3_bidirectional_image_attention_changes_the_reference() -> None:
    both_ways = expected(MODEL, ((SHORT, (1,)),))
    causal = _hf_causal_greedy(hf_model(MODEL), SHORT, 1)
    assert [causal] != both_ways
