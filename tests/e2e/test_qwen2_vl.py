"""Images through ``LLM.generate`` on the tiny Qwen2-VL (dynamic resolution,
M-RoPE) match transformers token for token (float32): one image, a batch of
images of different sizes with a text-only prompt, two images in one prompt,
and a prompt chunked inside its image tokens. In compiled mode the vision
encoder meets only the (images, patches) shapes warmup ran."""

from collections.abc import Iterator
from functools import cache, partial
from typing import Any

import numpy as np
import pytest
import torch
from models import model_path
from PIL import Image
from vllm import LLM, SamplingParams
from vllm.exceptions import VLLMValidationError

from e2e.harness import (
    compiled_graphs,
    default_engine,
    vllm_engine,
    vllm_greedy_with_images,
)

MODEL = "tiny-qwen2-vl"
MAX_TOKENS = 8
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
SHORT = f"<|bos|>USER: {IMAGE}What is in the picture? ASSISTANT:"
TEXT_ONLY = "<|bos|>USER: What is in the picture? ASSISTANT:"
TWO_IMAGES = f"<|bos|>USER: {IMAGE} and {IMAGE} Which is brighter? ASSISTANT:"
# Chunks of CHUNK tokens: the first one ends inside the image's tokens.
CHUNK = 16
SPLIT = f"<|bos|>The capital of France is Paris and{IMAGE}So the image shows"
# Pixel sizes (height, width): 2 x 3, 4 x 3, 3 x 4 and 2 x 2 image tokens.
SIZES = {1: (56, 84), 2: (112, 90), 3: (84, 112), 4: (60, 60)}


@cache
def image(seed: int) -> Image.Image:
    """A random RGB picture; its size sets the number of image tokens."""
    height, width = SIZES[seed]
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3))
    return Image.fromarray(pixels.astype(np.uint8))


@cache
def _hf_model() -> tuple[Any, Any]:
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    path = model_path(MODEL)
    model = Qwen2VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
    return AutoProcessor.from_pretrained(path), model.eval()


@cache
@torch.no_grad()
def hf_greedy(prompt: str, seeds: tuple[int, ...]) -> list[int]:
    """transformers' greedy continuation of ``prompt`` with ``image(seed)``s."""
    processor, model = _hf_model()
    images = [image(s) for s in seeds] or None
    inputs = processor(text=prompt, images=images, return_tensors="pt")
    # No stop token, as vLLM's ignore_eos (min_new_tokens would forbid EOS).
    output = model.generate(
        **inputs, max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=[]
    )
    return output[0, inputs["input_ids"].shape[1] :].tolist()


vllm_greedy = partial(vllm_greedy_with_images, image=image, max_tokens=MAX_TOKENS)


def expected(requests: list[tuple[str, tuple[int, ...]]]) -> list[list[int]]:
    return [hf_greedy(p, seeds) for p, seeds in requests]


@pytest.fixture(scope="module")
def llm() -> Iterator[LLM]:
    """Steps of at most CHUNK tokens: longer prompts run in chunks; vLLM's
    default engine (its core in a process of its own)."""
    with default_engine(
        str(model_path(MODEL)),
        max_model_len=256,
        enable_chunked_prefill=True,
        max_num_batched_tokens=CHUNK,
        max_num_seqs=4,
    ) as engine:
        yield engine


def test_one_image_matches_transformers(llm: LLM) -> None:
    requests = [(SHORT, (1,))]
    assert vllm_greedy(llm, requests) == expected(requests)


def test_images_of_different_sizes_and_a_text_prompt_in_one_batch(llm: LLM) -> None:
    requests = [(SHORT, (2,)), (SHORT, (3,)), (TEXT_ONLY, ())]
    assert vllm_greedy(llm, requests) == expected(requests)


def test_two_images_in_one_prompt_match_transformers(llm: LLM) -> None:
    requests = [(TWO_IMAGES, (1, 2)), (TWO_IMAGES, (2, 1))]
    outputs = vllm_greedy(llm, requests)
    assert outputs == expected(requests)
    assert outputs[0] != outputs[1]  # the order of the images matters


def test_chunk_ending_inside_the_image_tokens_matches_transformers(
    llm: LLM,
) -> None:
    processor, _ = _hf_model()
    inputs = processor(text=SPLIT, images=[image(3)], return_tensors="pt")
    ids = inputs["input_ids"][0].tolist()
    image_tokens = [i for i, t in enumerate(ids) if t == processor.image_token_id]
    assert image_tokens[0] < CHUNK <= image_tokens[-1]
    requests = [(SPLIT, (3,)), (SHORT, (4,))]
    assert vllm_greedy(llm, requests) == expected(requests)


def test_the_image_changes_the_output(llm: LLM) -> None:
    """The failure this guards against: the image silently ignored."""
    with_images = vllm_greedy(llm, [(SHORT, (1,)), (SHORT, (2,))])
    text_only = vllm_greedy(llm, [(SHORT.replace(IMAGE, ""), ())])
    assert with_images[0] != with_images[1]
    assert text_only[0] not in with_images


def test_a_video_is_refused_and_the_engine_keeps_serving(llm: LLM) -> None:
    """Video inputs are not validated: vLLM refuses them at the limit the
    plugin sets (model_support.UNVALIDATED_MODALITIES)."""
    video = {
        "prompt": "<|bos|><|vision_start|><|video_pad|><|vision_end|>",
        "multi_modal_data": {"video": np.zeros((4, 56, 56, 3), dtype=np.uint8)},
    }
    with pytest.raises(VLLMValidationError, match=r"At most 0 video\(s\)"):
        llm.generate([video], SamplingParams(max_tokens=1), use_tqdm=False)
    requests = [(SHORT, (4,))]
    assert vllm_greedy(llm, requests) == expected(requests)


def _record_encoder_shapes(worker: Any) -> list[list[int]]:
    """From now on, record (images, patches) of every vision encoder pass, the
    padding images left out; returns the shapes warmup ran."""
    runner = worker.model_runner
    seen: list[tuple[int, int]] = []

    def record(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        (pixels,) = args
        seen.append((len(kwargs["grid_thw"]) - 1, pixels.shape[0]))

    runner.model.visual.register_forward_pre_hook(record, with_kwargs=True)
    runner.encoder_shapes_seen = seen
    return [
        list(s) for s in runner.caps.multimodal.patch_buckets["image"].warmup_shapes()
    ]


def _encoder_shapes_seen(worker: Any) -> list[list[int]]:
    return [list(s) for s in worker.model_runner.encoder_shapes_seen]


def test_compiled_warmup_covers_every_encoder_and_decoder_shape(hpu_env) -> None:
    """Compiled emulation (dynamo's eager backend): after warmup, image prompts
    compile nothing, every vision encoder pass has a warmed-up shape, and the
    outputs match transformers."""
    hpu_env(
        VLLM_HPU_COMPILE_BACKEND="eager",
        VLLM_PROMPT_SEQ_BUCKET_MIN="32",
        VLLM_PROMPT_SEQ_BUCKET_STEP="32",
        VLLM_PROMPT_SEQ_BUCKET_MAX="64",
        VLLM_PROMPT_BLOCK_BUCKET_MAX="2",
    )
    engine = dict(block_size=16, max_model_len=96, max_num_seqs=2)
    requests = [(SHORT, (2,)), (TWO_IMAGES, (1, 3))]
    with vllm_engine(
        str(model_path(MODEL)),
        enforce_eager=False,
        max_num_batched_tokens=64,
        limit_mm_per_prompt={"image": 2, "video": 0},
        **engine,
    ) as llm:
        (warmed_shapes,) = llm.collective_rpc(_record_encoder_shapes)
        warmed = compiled_graphs()
        outputs = vllm_greedy(llm, requests)
        assert warmed > 0 and compiled_graphs() == warmed
        (seen,) = llm.collective_rpc(_encoder_shapes_seen)
    assert seen and all(shape in warmed_shapes for shape in seen)
    assert outputs == expected(requests)
