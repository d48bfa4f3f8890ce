"""Prefill/decode disaggregation over vLLM's NixlConnector, in emulation.

Two `vllm serve` instances (tiny-llama, greedy): a prefill instance
(kv_producer) and a decode instance (kv_consumer), each with its own NIXL agent
over UCX on loopback, behind ``examples/disagg_proxy.py``. One set of servers
for the file; the check that stops the prefill instance runs last.
"""

import contextlib
import pathlib
import random
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from models import model_path
from prometheus_client.parser import text_string_to_metric_families

from e2e.server import free_port, launch, serve_command, stop, wait_until_ready

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
BLOCK_SIZE = 16
MAX_TOKENS = 8
REPO = pathlib.Path(__file__).resolve().parents[2]
# NIXL's UCX backend over TCP on the loopback device only.
UCX_LOOPBACK = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "lo"}
SERVE_ARGS = [
    *("--served-model-name", MODEL, "--max-model-len", "256"),
    *("--block-size", str(BLOCK_SIZE), "--dtype", "float32", "--seed", "0"),
    "--enforce-eager",
]


def kv_transfer_args(kv_role: str) -> list[str]:
    config = f'{{"kv_connector":"NixlConnector","kv_role":"{kv_role}"}}'
    return [*SERVE_ARGS, "--kv-transfer-config", config]


def nixl_env(side_channel_port: int) -> dict[str, str]:
    return {
        **UCX_LOOPBACK,
        "VLLM_HPU_EMULATION": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_channel_port),
    }


class Instance:
    """A started process of the test; ``close`` stops its group once."""

    def __init__(self, command: list[str], env: dict[str, str], log: pathlib.Path):
        self.port = int(command[command.index("--port") + 1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.process = launch(command, env, log)

    def close(self) -> None:
        if self.process.poll() is None:
            alive = stop(self.process)
            assert not alive, f"processes left after shutdown: {alive}"


@pytest.fixture(scope="module")
def instances(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Instance]]:
    logs = tmp_path_factory.mktemp("disagg")
    model = str(model_path(MODEL))
    with contextlib.ExitStack() as stack:
        started = {}
        for name, role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
            command = serve_command(model, free_port(), kv_transfer_args(role))
            instance = Instance(command, nixl_env(free_port()), logs / f"{name}.log")
            stack.callback(instance.close)
            started[name] = instance
        for instance in started.values():  # both engines start at once
            wait_until_ready(instance.process, instance.url, instance.log)
        proxy_port = free_port()
        proxy_command = [
            sys.executable,
            str(REPO / "examples" / "disagg_proxy.py"),
            *("--port", str(proxy_port)),
            *("--prefill", started["prefill"].url, "--decode", started["decode"].url),
        ]
        proxy = Instance(proxy_command, {}, logs / "proxy.log")
        stack.callback(proxy.close)
        wait_until_ready(proxy.process, proxy.url, proxy.log)
        yield {**started, "proxy": proxy}


def prompts() -> dict[str, list[int]]:
    """Token ids longer than a block (a partial last block too); two of them
    share a prefix of three blocks."""
    rng = random.Random(0)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(3, 1024) for _ in range(n)]

    shared = tokens(3 * BLOCK_SIZE)
    return {
        "a": tokens(40),
        "b": tokens(57),
        "shared_1": shared + tokens(9),
        "shared_2": shared + tokens(20),
    }


def complete(url: str, prompt: list[int], **extra: Any) -> httpx.Response:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
        **extra,
    }
    return httpx.post(f"{url}/v1/completions", json=body, timeout=180)


def token_ids(response: httpx.Response) -> list[int]:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["token_ids"]


def metric_totals(url: str) -> dict[str, float]:
    """Samples of /metrics summed over their labels, by sample name, with the
    prompt tokens by source under ``prompt_tokens:<source>``."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name == "vllm:prompt_tokens_by_source_total":
                name = f"prompt_tokens:{sample.labels['source']}"
            totals[name] = totals.get(name, 0.0) + sample.value
    return totals


def test_kv_disaggregation_answers_as_one_instance(
    instances: dict[str, Instance],
) -> None:
    prefill, decode, proxy = (instances[k] for k in ("prefill", "decode", "proxy"))
    # One instance alone (the prefill one, so the decode instance caches nothing).
    expected = {n: token_ids(complete(prefill.url, p)) for n, p in prompts().items()}
    before = metric_totals(decode.url)
    # In order: the second shared prompt finds the prefix in the decode cache.
    got = {n: token_ids(complete(proxy.url, p)) for n, p in prompts().items()}
    assert got == expected
    after = metric_totals(decode.url)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    # Every request's KV crossed over NIXL: the decode instance prefilled no
    # prompt token itself (vLLM counts the last one, recomputed to sample the
    # first token, as transferred) and found the shared prefix in its cache.
    num_prompt_tokens = sum(len(p) for p in prompts().values())
    assert delta("vllm:nixl_xfer_time_seconds_count") == len(prompts())
    assert delta("vllm:nixl_num_failed_transfers_total") == 0
    assert delta("prompt_tokens:local_compute") == 0
    assert delta("prompt_tokens:local_cache_hit") == 3 * BLOCK_SIZE
    assert delta("prompt_tokens:external_kv_transfer") == (
        num_prompt_tokens - 3 * BLOCK_SIZE
    )
    # Both layers' keys and values of every block read (the last partial too).
    blocks_read = sum(-(-len(p) // BLOCK_SIZE) for p in prompts().values()) - 3
    block_bytes = 2 * 2 * BLOCK_SIZE * 2 * 64 * 4  # layers, K/V, heads, head, fp32
    assert delta("vllm:nixl_bytes_transferred_sum") == blocks_read * block_bytes


def test_kv_disaggregation_decode_survives_a_lost_prefill(
    instances: dict[str, Instance],
) -> None:
    prefill, decode = instances["prefill"], instances["decode"]
    rng = random.Random(1)
    prompt = [rng.randrange(3, 1024) for _ in range(40)]
    expected = token_ids(complete(prefill.url, prompt))
    prefilled = complete(
        prefill.url, prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True}
    )
    params = prefilled.json()["kv_transfer_params"]
    prefill.close()  # the decode instance loses its peer, KV still to be read

    lost = complete(decode.url, prompt, kv_transfer_params=params)
    assert lost.status_code >= 500, lost.text
    assert token_ids(complete(decode.url, prompt)) == expected
    assert metric_totals(decode.url)["vllm:nixl_num_failed_transfers_total"] >= 1
