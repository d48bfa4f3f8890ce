"""Mistral 3 with images (Pixtral tower: images kept at their own aspect, 2-D
rotary positions over the patch grid, a patch merger; [IMG_BREAK] after each row
of image tokens and [IMG_END], which take text embeddings): images of two sizes
and a text-only prompt in one batch, then two images in one prompt, equal
transformers token for token (float32). The test images give 3 x 4 and 4 x 3
image tokens (15 and 16 with the breaks): without the tower's 2-D positions the
reference gives other tokens."""

from typing import Any

import torch
from vllm import LLM

from e2e.harness import engine_spec, uses_engines
from e2e.test_qwen_vl import Requests, expected, hf_greedy, hf_model, vllm_greedy

MODEL = "tiny-mistral3"
IMAGE = "[IMG]"
SHORT = f"USER: {IMAGE}What is in the picture? ASSISTANT:"
TEXT_ONLY = "USER: What is in the picture? ASSISTANT:"
TWO_IMAGES = f"USER: {IMAGE} and {IMAGE} Which is brighter? ASSISTANT:"

IMAGES = engine_spec(
    MODEL,
    name="mistral3-images",
    block_size=16,
    max_model_len=256,
    max_num_seqs=4,
    limit_mm_per_prompt={"image": 2},
)


@uses_engines(IMAGES)
def test_mistral3_images_match_transformers(llm: LLM) -> None:
    batches: list[Requests] = [
        [(SHORT, (1,)), (SHORT, (2,)), (TEXT_ONLY, ())],
        [(TWO_IMAGES, (1, 2))],
    ]
    for requests in batches:
        assert vllm_greedy(llm, requests) == expected(MODEL, tuple(requests))


def _no_patch_positions(hf: Any) -> None:
    """The tower's rotary embedding turned into the identity (cos 1, sin 0)."""
    rotary = hf.model.vision_tower.patch_positional_embedding
    forward = rotary.forward

    def identity(x: torch.Tensor, position_ids: torch.Tensor) -> Any:
        cos, sin = forward(x, position_ids)
        return torch.ones_like(cos), torch.zeros_like(sin)

    rotary.forward = identity


def test_mistral3_patch_positions_change_the_reference() -> None:
    with_positions = expected(MODEL, ((SHORT, (1,)),))
    hf = hf_model(MODEL, _no_patch_positions)
    assert [hf_greedy(hf, MODEL, SHORT, (1,))] != with_positions
