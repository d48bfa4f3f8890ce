"""Qwen2.5-VL (windowed vision attention) and Qwen3-VL (deepstack features,
interleaved M-RoPE) through the bucketed encoder passes: images of two sizes and a
text-only prompt in one batch equal transformers token for token (float32). One
shared engine per model, each compiled (dynamo's eager backend) and compiling
nothing after warmup: Qwen2.5-VL's hits the prefix cache across an image,
Qwen3-VL's runs prompts in chunks that end inside the image tokens. Each test
image spans several of Qwen2.5-VL's windows, and Qwen3-VL's deepstack features
change the tokens (checked on the reference).
`vllm serve` answers a chat with an image (a base64 data URL) on Qwen3-VL with
transformers' text."""

import base64
import io
from collections.abc import Callable
from functools import cache, partial
from typing import Any

import numpy as np
import openai
import torch
from models import model_path
from PIL import Image
from vllm import LLM

from e2e.harness import (
    compiled_graphs,
    engine_spec,
    uses_engines,
    vllm_greedy_with_images,
)
from e2e.server import ServerSpec, uses_servers

QWEN2_5 = "tiny-qwen2.5-vl"
QWEN3 = "tiny-qwen3-vl"
MAX_TOKENS = 8
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
SHORT = f"<|bos|>USER: {IMAGE}What is in the picture? ASSISTANT:"
TEXT_ONLY = "<|bos|>USER: What is in the picture? ASSISTANT:"
TWO_IMAGES = f"<|bos|>USER: {IMAGE} and {IMAGE} Which is brighter? ASSISTANT:"
# Pixels (height, width): 3 x 4 and 4 x 2 image tokens for both models (28
# pixels a token for Qwen2.5-VL, 32 for Qwen3-VL, after their resizing).
SIZES = {1: (84, 112), 2: (112, 60)}
# Steps of at most CHUNK tokens: SHORT's first chunk ends inside its image.
CHUNK = 16

COMPILED = engine_spec(
    QWEN2_5,
    name="qwen2.5-vl-compiled",
    enforce_eager=False,
    block_size=16,
    max_model_len=96,
    max_num_seqs=3,
    max_num_batched_tokens=64,
    limit_mm_per_prompt={"image": 2, "video": 0},
    # 9 buckets to warm up: prompts of 64 tokens with 0 to 2 context blocks
    # (TWO_IMAGES hits SHORT's cached first block, image 1 included), and
    # decode of 1 to 3 sequences.
    env={
        "VLLM_HPU_COMPILE_BACKEND": "eager",
        "VLLM_PROMPT_SEQ_BUCKET_MIN": "64",
        "VLLM_PROMPT_SEQ_BUCKET_STEP": "64",
        "VLLM_PROMPT_SEQ_BUCKET_MAX": "64",
        "VLLM_PROMPT_BLOCK_BUCKET_MAX": "2",
    },
)
CHUNKED = engine_spec(
    QWEN3,
    name="qwen3-vl-chunked-compiled",
    enforce_eager=False,
    env={"VLLM_HPU_COMPILE_BACKEND": "eager"},
    max_model_len=256,
    enable_chunked_prefill=True,
    max_num_batched_tokens=CHUNK,
    max_num_seqs=4,
)
QWEN3_SERVER = ServerSpec(
    model=QWEN3,
    args=(
        *("--served-model-name", QWEN3, "--device", "hpu"),
        *("--dtype", "float32", "--seed", "0", "--enforce-eager"),
        *("--max-model-len", "256", "--max-num-seqs", "4"),
        *("--limit-mm-per-prompt", '{"image": 1, "video": 0}'),
    ),
    env=(("VLLM_HPU_EMULATION", "1"), ("VLLM_ENABLE_V1_MULTIPROCESSING", "1")),
    name="qwen3-vl-server",
)
QUESTION = "What is in the picture?"
Requests = list[tuple[str, tuple[int, ...]]]


def data_url(picture: Image.Image) -> str:
    """``picture`` as a base64 PNG data URL, as clients send images."""
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


@cache
def image(seed: int) -> Image.Image:
    """A random RGB picture; its size sets the number of image tokens."""
    height, width = SIZES[seed]
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3))
    return Image.fromarray(pixels.astype(np.uint8))


def hf_model(model: str, change: Callable[[Any], None] | None = None) -> Any:
    """transformers' model of ``model``, changed by ``change`` if given."""
    from transformers import AutoModelForImageTextToText

    path = model_path(model)
    hf = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    if change is not None:
        change(hf)
    return hf.eval()


@cache
def processor(model: str) -> Any:
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model_path(model))


@torch.no_grad()
def hf_greedy(hf: Any, model: str, prompt: str, seeds: tuple[int, ...]) -> list[int]:
    """transformers' greedy continuation of ``prompt`` with ``image(seed)``s."""
    images = [image(s) for s in seeds] or None
    inputs = processor(model)(text=prompt, images=images, return_tensors="pt")
    # No stop token, as vLLM's ignore_eos (min_new_tokens would forbid EOS).
    output = hf.generate(
        **inputs, max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=[]
    )
    return output[0, inputs["input_ids"].shape[1] :].tolist()


@cache
def expected(model: str, requests: tuple[tuple[str, tuple[int, ...]], ...]) -> list:
    hf = hf_model(model)
    return [hf_greedy(hf, model, p, seeds) for p, seeds in requests]


vllm_greedy = partial(vllm_greedy_with_images, image=image, max_tokens=MAX_TOKENS)


@uses_engines(COMPILED)
def test_qwen2_5_vl_compiled_matches_transformers_and_compiles_nothing_new(
    llm: LLM,
) -> None:
    """Images of two sizes and a text-only prompt in one batch, then two images
    in one prompt: equal to transformers, and no graph compiled after warmup."""
    warmed = compiled_graphs()
    batches: list[Requests] = [
        [(SHORT, (1,)), (SHORT, (2,)), (TEXT_ONLY, ())],
        [(TWO_IMAGES, (1, 2))],
    ]
    for requests in batches:
        assert vllm_greedy(llm, requests) == expected(QWEN2_5, tuple(requests))
    assert warmed > 0 and compiled_graphs() == warmed


def _full_attention_everywhere(hf: Any) -> None:
    visual = hf.model.visual
    visual.fullatt_block_indexes = list(range(len(visual.blocks)))


def test_qwen2_5_vl_windows_bind_on_the_test_images() -> None:
    """The reference changes when the tower attends over whole images: the
    images cross windows, so the tests above check the windowed attention."""
    windowed = expected(QWEN2_5, ((SHORT, (1,)),))
    hf = hf_model(QWEN2_5, _full_attention_everywhere)
    assert [hf_greedy(hf, QWEN2_5, SHORT, (1,))] != windowed


@uses_engines(CHUNKED)
def test_qwen3_vl_matches_transformers_with_chunks_inside_images(llm: LLM) -> None:
    """Images of two sizes and a text-only prompt in one batch, in chunks of
    CHUNK tokens (the first ends inside the image), then two images in one
    prompt, in either order; compiled, nothing compiled after warmup."""
    warmed = compiled_graphs()
    qwen3 = processor(QWEN3)
    ids = qwen3(text=SHORT, images=[image(1)])["input_ids"][0]
    image_tokens = [i for i, t in enumerate(ids) if t == qwen3.image_token_id]
    assert image_tokens[0] < CHUNK <= image_tokens[-1]
    batches: list[Requests] = [
        [(SHORT, (1,)), (SHORT, (2,)), (TEXT_ONLY, ())],
        [(TWO_IMAGES, (1, 2)), (TWO_IMAGES, (2, 1))],
    ]
    for requests in batches:
        outputs = vllm_greedy(llm, requests)
        assert outputs == expected(QWEN3, tuple(requests))
    assert outputs[0] != outputs[1]  # the order of the images matters
    assert warmed > 0 and compiled_graphs() == warmed


def _no_deepstack(hf: Any) -> None:
    hf.model.visual.deepstack_visual_indexes = []


def test_qwen3_vl_deepstack_changes_the_reference() -> None:
    with_deepstack = expected(QWEN3, ((SHORT, (1,)),))
    hf = hf_model(QWEN3, _no_deepstack)
    assert [hf_greedy(hf, QWEN3, SHORT, (1,))] != with_deepstack


@torch.no_grad()
def hf_chat_text(model: str, seed: int) -> str:
    """transformers' greedy answer to a user turn of ``image(seed)`` and
    QUESTION, rendered by the model's own chat template and processor."""
    content = [{"type": "image"}, {"type": "text", "text": QUESTION}]
    prompt = processor(model).apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True
    )
    # The template writes the BOS token itself.
    inputs = processor(model)(
        text=prompt, images=[image(seed)], return_tensors="pt", add_special_tokens=False
    )
    output = hf_model(model).generate(
        **inputs, max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=[]
    )
    new_tokens = output[0, inputs["input_ids"].shape[1] :]
    return processor(model).decode(new_tokens, skip_special_tokens=True)


def chat(client: openai.OpenAI, urls: list[str]) -> str:
    """The server's greedy answer to a user turn of the images at ``urls``
    and QUESTION."""
    parts: list[Any] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    response = client.chat.completions.create(
        model=QWEN3,
        messages=[
            {"role": "user", "content": [*parts, {"type": "text", "text": QUESTION}]}
        ],
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        extra_body={"ignore_eos": True},
    )
    return response.choices[0].message.content or ""


@uses_servers(QWEN3_SERVER)
def test_qwen3_vl_server_answers_an_image_chat_as_transformers(
    server_url: str,
) -> None:
    client = openai.OpenAI(base_url=f"{server_url}/v1", api_key="EMPTY", max_retries=0)
    answer = chat(client, [data_url(image(2))])
    assert answer and answer == hf_chat_text(QWEN3, 2)
