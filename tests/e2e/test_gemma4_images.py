"""Gemma 4 with images (Gemma4ForConditionalGeneration: transformers' own vision
tower before the tiny Gemma 4 decoder, KV sharing on): images of two sizes and
a text-only prompt in one batch equal transformers token for token (float32),
through vLLM's default engine (its core in a process of its own), compiled
(dynamo's eager backend) and compiling nothing after warmup. Each image's
tokens attend to each other both ways in the windowed layers only, within the
window (vLLM's mm prefix ranges, clamped), and causally in the full layers;
both images are longer than the window. transformers with the image tokens
causal, or attending both ways in every layer, gives other tokens, so the test
checks the spans and the layers they apply to."""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from conftest import MODELS_DIR
from vllm import LLM

from e2e.harness import (
    DEFAULT_ENGINE,
    SENDS_CALLABLES,
    core_in_own_process,
    engine_spec,
    one_bucket,
    uses_engines,
    workers_compiled_graphs,
)
from e2e.test_qwen_vl import (
    Requests,
    expected,
    hf_greedy,
    hf_model,
    image,
    processor,
    vllm_greedy,
)

MODEL = "tiny-gemma4-vl"
IMAGE = "<|image|>"
SHORT = f"USER: {IMAGE}What is in the picture? ASSISTANT:"
TEXT_ONLY = "USER: What is in the picture? ASSISTANT:"
BATCH: Requests = [(SHORT, (1,)), (SHORT, (2,)), (TEXT_ONLY, ())]

IMAGES = engine_spec(
    MODEL,
    name="gemma4-images-compiled",
    enforce_eager=False,
    max_model_len=128,
    max_num_seqs=4,
    max_num_batched_tokens=384,
    limit_mm_per_prompt={"image": 1},
    # One prompt bucket (4 rows of 96 tokens, no context) and one decode
    # bucket (4 rows over 4 blocks of 128).
    env={
        **DEFAULT_ENGINE,
        **SENDS_CALLABLES,  # compiled graphs read in the engine's process
        "VLLM_HPU_COMPILE_BACKEND": "eager",
        **one_bucket("PROMPT_BS", 4),
        **one_bucket("PROMPT_SEQ", 96),
        "VLLM_PROMPT_BLOCK_BUCKET_MAX": "0",
        **one_bucket("DECODE_BS", 4),
        **one_bucket("DECODE_BLOCK", 4),
    },
)


def _window() -> int:
    config = json.loads((MODELS_DIR / MODEL / "config.json").read_text())
    return config["text_config"]["sliding_window"]


@uses_engines(IMAGES)
def test_gemma4_images_match_transformers(llm: LLM) -> None:
    gemma4 = processor(MODEL)
    for seed in (1, 2):
        ids = gemma4(text=SHORT, images=[image(seed)])["input_ids"][0]
        assert ids.count(gemma4.image_token_id) > _window()
    assert core_in_own_process(llm)
    (warmed,) = workers_compiled_graphs(llm)
    assert vllm_greedy(llm, BATCH) == expected(MODEL, tuple(BATCH))
    assert warmed > 0 and workers_compiled_graphs(llm) == [warmed]


@contextmanager
def _image_masks(every_layer: bool) -> Iterator[None]:
    """transformers' Gemma 4 with its image tokens causal (no spans), or with
    spans in the full layers too (without a window there)."""
    from transformers.masking_utils import blockwise_overlay, create_causal_mask
    from transformers.models.gemma4 import modeling_gemma4

    own = modeling_gemma4.create_masks_for_vision_model

    def masks(block_sequence_ids: Any, **kwargs: Any) -> dict[str, Any]:
        if not every_layer:
            return modeling_gemma4.create_masks_for_generate(**kwargs)
        both_ways = blockwise_overlay(block_sequence_ids)
        return {
            **own(block_sequence_ids=block_sequence_ids, **kwargs),
            "full_attention": create_causal_mask(**kwargs, or_mask_function=both_ways),
        }

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(modeling_gemma4, "create_masks_for_vision_model", masks)
        yield


def test_gemma4_image_spans_per_layer_change_the_reference() -> None:
    """The windowed layers' spans, and their absence from the full layers,
    decide the tokens: the test above checks both. (Causal image tokens are
    also what dropping the spans longer than the window, vLLM's rule for
    models that do not clamp them, would give: both images are longer.)"""
    images = BATCH[:2]
    windowed_only = expected(MODEL, tuple(BATCH))[:2]
    hf = hf_model(MODEL)
    for every_layer in (False, True):
        with _image_masks(every_layer):
            other = [hf_greedy(hf, MODEL, p, seeds) for p, seeds in images]
        assert other[0] != windowed_only[0], every_layer
        assert other[1] != windowed_only[1], every_layer
