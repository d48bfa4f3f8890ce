"""`vllm serve` with images as base64 PNG data URLs through the `openai` client,
on the Qwen3-VL server test_qwen_vl.py shares (whose image chat equals
transformers'; LLaVA's images are checked offline in test_multimodal.py): a bad
image (undecodable, more than --limit-mm-per-prompt) gets a 4xx and the server
goes on answering as transformers does."""

import base64

import openai
import pytest

from e2e.server import uses_servers
from e2e.test_qwen_vl import QWEN3, QWEN3_SERVER, chat, data_url, hf_chat_text, image

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "urls",
    [
        ["data:image/png;base64," + base64.b64encode(b"not a png").decode()],
        [data_url(image(1)), data_url(image(2))],  # over --limit-mm-per-prompt
    ],
    ids=["undecodable", "too-many-images"],
)
@uses_servers(QWEN3_SERVER)
def test_serve_bad_image_gets_4xx_then_serves(server_url: str, urls: list[str]) -> None:
    client = openai.OpenAI(base_url=f"{server_url}/v1", api_key="EMPTY", max_retries=0)
    with pytest.raises(openai.APIStatusError) as error:
        chat(client, urls)
    assert 400 <= error.value.status_code < 500, error.value
    assert chat(client, [data_url(image(2))]) == hf_chat_text(QWEN3, 2)
