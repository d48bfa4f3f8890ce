"""Images through ``LLM.generate`` on the tiny LLaVA match transformers token for
token (float32): one image, a batch of two images and a text-only prompt, a
chunked prompt splitting the image tokens, and prefix-cache hits keyed by image."""

from collections.abc import Iterator
from functools import cache
from typing import Any

import numpy as np
import pytest
import torch
from models import model_path
from PIL import Image
from vllm import LLM

from e2e.harness import (
    compiled_graphs,
    default_engine,
    vllm_engine,
    vllm_greedy_with_images,
)

MODEL = "tiny-llava"
MAX_TOKENS = 8
SHORT = "<|bos|>USER: <image>\nWhat is in the picture? ASSISTANT:"
TEXT_ONLY = "<|bos|>USER: What is in the picture? ASSISTANT:"
# Ten tokens before the 16 image tokens: a 16-token chunk ends inside them.
SPLIT = "<|bos|>The capital of France is Paris and<image>\nSo the image shows"
# Over one 128-token KV block after the image: a prefix-cache hit needs a full block.
LONG = "<|bos|><image>\n" + " ".join(
    ["The quick brown fox jumps over the lazy dog."] * 7
)


@cache
def image(seed: int) -> Image.Image:
    """A small random RGB picture; the processor resizes it to 56 x 56."""
    pixels = np.random.default_rng(seed).integers(0, 256, (40, 48, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@cache
def _hf_model() -> tuple[Any, Any]:
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    path = model_path(MODEL)
    model = LlavaForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
    return AutoProcessor.from_pretrained(path), model.eval()


@cache
@torch.no_grad()
def hf_greedy(prompt: str, seed: int | None) -> list[int]:
    """transformers' greedy continuation of ``prompt`` with ``image(seed)``."""
    processor, model = _hf_model()
    images = None if seed is None else image(seed)
    inputs = processor(text=prompt, images=images, return_tensors="pt")
    output = model.generate(
        **inputs, max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS, do_sample=False
    )
    return output[0, inputs["input_ids"].shape[1] :].tolist()


def vllm_greedy(llm: LLM, requests: list[tuple[str, int | None]]) -> list[list[int]]:
    """Each request with one image (its seed) or none."""
    with_seeds = [(p, () if s is None else (s,)) for p, s in requests]
    return vllm_greedy_with_images(llm, with_seeds, image, MAX_TOKENS)


@pytest.fixture(scope="module")
def llm() -> Iterator[LLM]:
    # vLLM's default engine (its core in a process of its own).
    with default_engine(str(model_path(MODEL)), max_model_len=256) as engine:
        yield engine


def test_one_image_matches_transformers(llm: LLM) -> None:
    assert vllm_greedy(llm, [(SHORT, 1)]) == [hf_greedy(SHORT, 1)]


def test_batch_of_two_images_and_a_text_prompt_matches_transformers(llm: LLM) -> None:
    requests = [(SHORT, 2), (SPLIT, 3), (TEXT_ONLY, None)]
    expected = [hf_greedy(p, s) for p, s in requests]
    assert vllm_greedy(llm, requests) == expected


def test_the_image_changes_the_output(llm: LLM) -> None:
    """The failure this guards against: the image silently ignored."""
    with_images = vllm_greedy(llm, [(SHORT, 1), (SHORT, 2)])
    text_only = vllm_greedy(llm, [(SHORT.replace("<image>\n", ""), None)])
    assert with_images[0] != with_images[1]
    assert text_only[0] not in with_images


def test_prefix_cache_hits_are_keyed_by_the_image(llm: LLM) -> None:
    """The same tokens with another image must not reuse the first one's KV;
    with the same image they do, and the output stays the same."""
    first = vllm_greedy(llm, [(LONG, 4)])
    other_image = vllm_greedy(llm, [(LONG, 5)])
    hits_before = _prefix_cache_hits(llm)
    again = vllm_greedy(llm, [(LONG, 4)])
    assert first == again == [hf_greedy(LONG, 4)]
    assert other_image == [hf_greedy(LONG, 5)]
    assert _prefix_cache_hits(llm) > hits_before


def _prefix_cache_hits(llm: LLM) -> float:
    return sum(
        getattr(m, "value", 0)
        for m in llm.get_metrics()
        if m.name == "vllm:prefix_cache_hits"
    )


def test_chunked_prompt_splitting_the_image_tokens_matches_transformers() -> None:
    with vllm_engine(
        str(model_path(MODEL)),
        max_model_len=256,
        enable_chunked_prefill=True,
        max_num_batched_tokens=16,
        max_num_seqs=2,
    ) as llm:
        requests = [(SPLIT, 6), (SHORT, 7)]
        outputs = vllm_greedy(llm, requests)
    assert outputs == [hf_greedy(p, s) for p, s in requests]


def test_compiled_warmup_leaves_nothing_to_compile_for_images(hpu_env) -> None:
    """Compiled emulation (dynamo's eager backend): after warmup, image prompts
    compile nothing and match transformers. One sequence per step keeps the
    bucket set (and the warmup's compilations) small."""
    hpu_env(
        VLLM_HPU_COMPILE_BACKEND="eager",
        VLLM_PROMPT_SEQ_BUCKET_MIN="32",
        VLLM_PROMPT_SEQ_BUCKET_STEP="32",
        VLLM_PROMPT_SEQ_BUCKET_MAX="64",
        VLLM_PROMPT_BLOCK_BUCKET_MAX="2",
    )
    engine = dict(block_size=16, max_model_len=96, max_num_seqs=1)
    requests = [(SHORT, 2), (SPLIT, 3)]
    with vllm_engine(str(model_path(MODEL)), enforce_eager=False, **engine) as llm:
        warmed = compiled_graphs()
        outputs = vllm_greedy(llm, requests)
        assert warmed > 0 and compiled_graphs() == warmed
    assert outputs == [hf_greedy(p, s) for p, s in requests]
