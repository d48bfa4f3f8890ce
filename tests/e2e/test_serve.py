"""`vllm serve` on the plugin, spoken to with the official `openai` client.

One server for the whole file (tiny-llama, greedy): completions, chat, streaming,
bad input answered with 4xx while the server keeps serving, 64 concurrent streams
against the same prompts sent one by one, and the plugin's metrics on /metrics.
"""

import asyncio
import pathlib
import subprocess
import sys
from typing import Any

import httpx
import openai
import pytest

from e2e.server import TINY_LLAMA_SERVER, uses_servers

# One server for the whole file, shared with test_gaudi_commands; its engine
# runs in its own process, whose vllm_hpu:* metrics reach the API's /metrics.
pytestmark = [pytest.mark.slow, uses_servers(TINY_LLAMA_SERVER)]

MODEL = "tiny-llama"
MAX_MODEL_LEN = 256
MAX_TOKENS = 12
NUM_CONCURRENT = 64
LOAD_TIMEOUT_S = 180
GREEDY: dict[str, Any] = {
    "model": MODEL,
    "max_tokens": MAX_TOKENS,
    "temperature": 0.0,
    "extra_body": {"ignore_eos": True},
}
REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def base_url(server_url: str) -> str:
    return server_url


@pytest.fixture
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="EMPTY", max_retries=0)


def prompt(index: int) -> str:
    return f"Request number {index}: tell me about the colour of the sea"


def complete(client: openai.OpenAI, text: str) -> str:
    return client.completions.create(prompt=text, **GREEDY).choices[0].text


@pytest.mark.other_vllm
def test_serve_health_and_models(base_url: str, client: openai.OpenAI) -> None:
    assert httpx.get(f"{base_url}/health", timeout=10).status_code == 200
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].max_model_len == MAX_MODEL_LEN  # type: ignore[attr-defined]


@pytest.mark.other_vllm
def test_serve_completion_stream_equals_non_streamed(client: openai.OpenAI) -> None:
    text = complete(client, prompt(0))
    stream = client.completions.create(
        prompt=prompt(0), stream=True, stream_options={"include_usage": True}, **GREEDY
    )
    chunks = list(stream)
    assert text and "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == MAX_TOKENS


@pytest.mark.other_vllm
def test_serve_chat_stream_equals_non_streamed(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "What colour is the sea?"}]
    chat = client.chat.completions.create(messages=messages, **GREEDY)
    answer = chat.choices[0].message.content
    assert chat.choices[0].message.role == "assistant"
    # The chat template wrapped the message: more prompt tokens than words.
    assert chat.usage is not None and chat.usage.prompt_tokens > 5
    stream = client.chat.completions.create(messages=messages, stream=True, **GREEDY)
    deltas = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert answer and "".join(deltas) == answer


BAD_REQUESTS = {
    "prompt_too_long": ("/v1/completions", {"prompt": [5] * (MAX_MODEL_LEN + 1)}),
    "negative_max_tokens": ("/v1/completions", {"max_tokens": -1}),
    "unknown_model": ("/v1/completions", {"model": "no-such-model"}),
    "temperature_negative": ("/v1/completions", {"temperature": -1.0}),
    "top_p_above_one": ("/v1/completions", {"top_p": 2.0}),
    "chat_top_p_above_one": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "top_p": 2.0},
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_serve_bad_input_gets_4xx_then_serves(
    base_url: str, client: openai.OpenAI, case: str
) -> None:
    path, fields = BAD_REQUESTS[case]
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 4, **fields}
    if "messages" in body:
        del body["prompt"]
    response = httpx.post(f"{base_url}{path}", json=body, timeout=30)
    assert_error_body(response)
    assert complete(client, prompt(1))


def test_serve_malformed_json_gets_400_then_serves(
    base_url: str, client: openai.OpenAI
) -> None:
    response = httpx.post(
        f"{base_url}/v1/completions",
        content=b'{"model": "tiny-llama", "prompt": "hi",',
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 400
    assert_error_body(response)
    assert complete(client, prompt(1))


def assert_error_body(response: httpx.Response) -> None:
    """vLLM's ErrorResponse: {"error": {"message", "type", "param", "code"}}."""
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert error["code"] == response.status_code
    assert error["message"] and error["type"]


async def stream_one(client: openai.AsyncOpenAI, index: int) -> tuple[str, str, int]:
    """(response id, text, completion tokens) of one streamed completion."""
    stream = await client.completions.create(
        prompt=prompt(index),
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,
    )
    ids, pieces, num_tokens = set(), [], 0
    async for chunk in stream:
        ids.add(chunk.id)
        pieces.extend(choice.text for choice in chunk.choices)
        if chunk.usage is not None:
            num_tokens = chunk.usage.completion_tokens
    assert len(ids) == 1, f"one stream carried several responses: {ids}"
    return ids.pop(), "".join(pieces), num_tokens


async def stream_all(base_url: str) -> list[tuple[str, str, int]]:
    client = openai.AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="EMPTY", max_retries=0
    )
    try:
        requests = [stream_one(client, i) for i in range(NUM_CONCURRENT)]
        return await asyncio.wait_for(asyncio.gather(*requests), LOAD_TIMEOUT_S)
    finally:
        await client.close()


def test_serve_concurrent_streams_match_sequential(
    base_url: str, client: openai.OpenAI
) -> None:
    expected = [complete(client, prompt(i)) for i in range(NUM_CONCURRENT)]
    results = asyncio.run(stream_all(base_url))
    response_ids = [response_id for response_id, _, _ in results]
    assert len(set(response_ids)) == NUM_CONCURRENT
    assert [num_tokens for _, _, num_tokens in results] == [MAX_TOKENS] * NUM_CONCURRENT
    assert [text for _, text, _ in results] == expected


def metric_values(base_url: str) -> dict[str, float]:
    """Samples of /metrics as {'name{labels}': value}."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def test_serve_metrics_has_vllm_and_plugin_metrics(
    base_url: str, client: openai.OpenAI
) -> None:
    before = metric_values(base_url)
    complete(client, prompt(2))
    after = metric_values(base_url)
    assert any(name.startswith("vllm:generation_tokens_total") for name in after)
    hits = 'vllm_hpu:bucket_hits_total{phase="decode"}'
    assert after[hits] >= before.get(hits, 0) + MAX_TOKENS - 1
    assert 'vllm_hpu:bucket_misses_total{phase="prompt"}' in after
    assert 0.0 <= after['vllm_hpu:padding_ratio{kind="prompt_tokens"}'] < 1.0
    assert after["vllm_hpu:compilations_after_warmup_total"] >= 0


def test_serve_example_client_runs(base_url: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "openai_client.py"),
            *("--base-url", f"{base_url}/v1", "--model", MODEL, "--max-tokens", "8"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "completion:" in result.stdout and "streamed chat:" in result.stdout
