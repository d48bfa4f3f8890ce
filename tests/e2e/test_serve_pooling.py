"""`vllm serve --runner pooling` on the plugin: /v1/embeddings against transformers.

One server, MEAN pooling (not the model's default; test_pooling checks every
pooling type offline on the same path); token-id inputs of mixed lengths in one
request, so the comparison with transformers needs no tokenizer round trip.
"""

import json
import pathlib
from collections.abc import Iterator

import openai
import pytest
from models import model_path
from transformers import AutoTokenizer

from e2e.harness import random_prompts
from e2e.server import vllm_server
from e2e.test_pooling import (
    MAX_MODEL_LEN,
    MODEL,
    PROMPT_LENGTHS,
    VOCAB_SIZE,
    assert_embeddings_match,
    hf_embeddings,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[openai.OpenAI, str]]:
    pooling_type = "MEAN"
    workdir: pathlib.Path = tmp_path_factory.mktemp(f"serve-{pooling_type}")
    args = [
        *("--served-model-name", MODEL, "--runner", "pooling"),
        *("--pooler-config", json.dumps({"pooling_type": pooling_type})),
        *("--max-model-len", str(MAX_MODEL_LEN)),
        *("--dtype", "float32", "--seed", "0", "--enforce-eager"),
    ]
    env = {"VLLM_HPU_EMULATION": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    with vllm_server(model_path(MODEL), args, env, workdir / "server.log") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="EMPTY", max_retries=0)
        yield client, pooling_type


def test_serve_embeddings_equal_transformers(
    served: tuple[openai.OpenAI, str],
) -> None:
    client, pooling_type = served
    prompts = random_prompts(PROMPT_LENGTHS, VOCAB_SIZE, seed=5)
    response = client.embeddings.create(
        model=MODEL, input=prompts, encoding_format="float"
    )
    assert [item.index for item in response.data] == list(range(len(prompts)))
    assert response.usage.prompt_tokens == sum(PROMPT_LENGTHS)
    actual = [item.embedding for item in response.data]
    assert_embeddings_match(actual, hf_embeddings(prompts, pooling_type))


def test_serve_embeddings_of_text(served: tuple[openai.OpenAI, str]) -> None:
    """Text is tokenized by the server as by the model's own tokenizer."""
    client, pooling_type = served
    texts = ["The sea is blue.", "A much longer sentence about the colour of the sea."]
    response = client.embeddings.create(model=MODEL, input=texts)
    tokenizer = AutoTokenizer.from_pretrained(model_path(MODEL))
    prompts = [tokenizer(text).input_ids for text in texts]
    actual = [item.embedding for item in response.data]
    assert_embeddings_match(actual, hf_embeddings(prompts, pooling_type))
