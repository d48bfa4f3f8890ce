"""A multimodal architecture (Mistral 3: Pixtral tower) started with every
modality limited to 0 runs as a text model, as any multimodal class the plugin
refuses images for would: greedy tokens equal transformers' on the same
checkpoint (float32), and an image is refused while the engine keeps serving."""

from functools import cache
from typing import Any

import numpy as np
import pytest
import torch
from models import model_path
from PIL import Image
from vllm import LLM, SamplingParams

from e2e.harness import engine_spec, random_prompts, uses_engines

MODEL = "tiny-mistral3"
MAX_TOKENS = 8
TEXT_VOCAB = 1024  # the image tokens sit past it
PROMPTS = random_prompts([7, 30, 75], TEXT_VOCAB, seed=3)
TEXT_ONLY = engine_spec(
    MODEL,
    name="mistral3-text-only",
    block_size=16,
    max_model_len=256,
    limit_mm_per_prompt={"image": 0},
)


@cache
@torch.no_grad()
def hf_greedy(prompt: tuple[int, ...]) -> list[int]:
    from transformers import Mistral3ForConditionalGeneration

    model = Mistral3ForConditionalGeneration.from_pretrained(
        model_path(MODEL), dtype=torch.float32
    ).eval()
    input_ids = torch.tensor([prompt])
    output = model.generate(
        input_ids=input_ids,
        max_new_tokens=MAX_TOKENS,
        do_sample=False,
        eos_token_id=[],
    )
    return output[0, input_ids.shape[1] :].tolist()


def _feeds_media(worker: Any) -> bool:
    from vllm_hpu.worker.capabilities.multimodal import MultimodalInputs

    return isinstance(worker.model_runner.caps.multimodal, MultimodalInputs)


@uses_engines(TEXT_ONLY)
def test_mistral3_with_every_limit_at_0_matches_transformers_on_text(
    llm: LLM,
) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    prompts: list[Any] = [{"prompt_token_ids": p} for p in PROMPTS]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    assert tokens == [hf_greedy(tuple(p)) for p in PROMPTS]
    assert llm.collective_rpc(_feeds_media) == [False]
    picture = Image.fromarray(np.zeros((56, 56, 3), dtype=np.uint8))
    image_prompt = {"prompt": "[IMG]Hello", "multi_modal_data": {"image": picture}}
    # vLLM's own refusal of media for a model it runs as text only.
    with pytest.raises(ValueError, match="not available for text-only models"):
        llm.generate([image_prompt], params, use_tqdm=False)
    again = llm.generate(prompts[:1], params, use_tqdm=False)
    assert list(again[0].outputs[0].token_ids) == tokens[0]
