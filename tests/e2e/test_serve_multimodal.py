"""`vllm serve` on the tiny LLaVA with images as base64 PNG data URLs through the
`openai` client: the same text as transformers offline; a bad image (undecodable,
more than --limit-mm-per-prompt) gets a 4xx and the server keeps serving."""

import base64
import io
import pathlib
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import torch
from models import model_path
from PIL import Image

from e2e.server import vllm_server
from e2e.test_multimodal import MAX_TOKENS, image

pytestmark = pytest.mark.slow

MODEL = "tiny-llava"
QUESTION = "What is in the picture?"


def data_url(picture: Image.Image) -> str:
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def chat(client: openai.OpenAI, urls: list[str]) -> str:
    parts: list[Any] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    response = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": [*parts, {"type": "text", "text": QUESTION}]}
        ],
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        extra_body={"ignore_eos": True},
    )
    return response.choices[0].message.content or ""


@torch.no_grad()
def hf_chat_text(seed: int) -> str:
    """transformers' greedy answer to the same chat, rendered by the model's
    own chat template and processor."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    path = model_path(MODEL)
    processor = AutoProcessor.from_pretrained(path)
    model = LlavaForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
    content = [{"type": "image"}, {"type": "text", "text": QUESTION}]
    prompt = processor.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True
    )
    # The template writes the BOS token itself.
    inputs = processor(
        text=prompt, images=image(seed), return_tensors="pt", add_special_tokens=False
    )
    output = model.eval().generate(
        **inputs, max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS, do_sample=False
    )
    new_tokens = output[0, inputs["input_ids"].shape[1] :]
    return processor.decode(new_tokens, skip_special_tokens=True)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    workdir: pathlib.Path = tmp_path_factory.mktemp("serve_multimodal")
    args = [
        *("--served-model-name", MODEL, "--max-model-len", "128"),
        *("--dtype", "float32", "--seed", "0", "--enforce-eager"),
        *("--limit-mm-per-prompt", '{"image": 1}'),
    ]
    env = {"VLLM_HPU_EMULATION": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    with vllm_server(str(model_path(MODEL)), args, env, workdir / "server.log") as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="EMPTY", max_retries=0)


def test_serve_image_data_url_matches_offline(client: openai.OpenAI) -> None:
    assert chat(client, [data_url(image(1))]) == hf_chat_text(1)


@pytest.mark.parametrize(
    "urls",
    [
        ["data:image/png;base64," + base64.b64encode(b"not a png").decode()],
        [data_url(image(1)), data_url(image(2))],  # over --limit-mm-per-prompt
    ],
    ids=["undecodable", "too-many-images"],
)
def test_serve_bad_image_gets_4xx_then_serves(
    client: openai.OpenAI, urls: list[str]
) -> None:
    with pytest.raises(openai.APIStatusError) as error:
        chat(client, urls)
    assert 400 <= error.value.status_code < 500, error.value
    assert chat(client, [data_url(image(2))])
