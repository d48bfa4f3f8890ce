"""Multi-node over Ray, as README_GAUDI's multi-node section runs it: two Ray
nodes on this machine, each in its own network namespace with its own address
and one emulated HPU (tests/e2e/ray_nodes.py), and `vllm serve` on the head with
``--distributed-executor-backend ray``, first with two pipeline stages, then
with tensor parallelism of two, on the same cluster. Each layout must place one
worker on each node and answer transformers' greedy tokens (which equal the
single-node engine's: test_generate).

Needs root (network namespaces): it fails, never skips, without it.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from models import model_path

from e2e import ray_nodes
from e2e.harness import hf_greedy, random_prompts
from e2e.server import KV_CACHE_BYTES, log_tail

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
PROMPTS = random_prompts([5, 30], 1024, seed=7)
MAX_TOKENS = 8
PORT = 8000
LAYOUTS = {
    "pp2": ["--pipeline-parallel-size", "2"],  # one stage per node
    "tp2": ["--tensor-parallel-size", "2"],  # every layer split over the nodes
}
READY_TIMEOUT_S = 300  # vLLM imported by the server, its engine, two Ray actors
STOP_TIMEOUT_S = 60

# Run on the head node: waits for the server, prints each prompt's tokens.
CLIENT = """
import json, sys, time, httpx
url, prompts, max_tokens, timeout = sys.argv[1], json.loads(sys.argv[2]), *sys.argv[3:]
deadline = time.monotonic() + float(timeout)
while True:
    try:
        if httpx.get(url + "/health", timeout=5).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    if time.monotonic() > deadline:
        raise SystemExit("no server")
    time.sleep(1)
for prompt in prompts:
    body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": int(max_tokens),
            "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}
    reply = httpx.post(url + "/v1/completions", json=body, timeout=120)
    reply.raise_for_status()
    print(json.dumps(reply.json()["choices"][0]["token_ids"]), flush=True)
"""


def serve_command(head: ray_nodes.Node, layout: str) -> list[str]:
    return head.command(
        sys.executable, "-m", "vllm.entrypoints.cli.main", "serve",
        model_path(MODEL),
        "--served-model-name", MODEL,
        "--host", head.address,
        "--port", str(PORT),
        "--distributed-executor-backend", "ray",
        *LAYOUTS[layout],
        "--dtype", "float32",
        "--seed", "0",
        "--enforce-eager",
        "--block-size", "16",
        "--max-model-len", "256",
        "--kv-cache-memory-bytes", str(KV_CACHE_BYTES),
    )  # fmt: skip


def client_command(head: ray_nodes.Node) -> list[str]:
    url = f"http://{head.address}:{PORT}"
    args = [url, json.dumps(PROMPTS), str(MAX_TOKENS), str(READY_TIMEOUT_S)]
    return head.command(sys.executable, "-c", textwrap.dedent(CLIENT), *args)


def answers(server: subprocess.Popen, client: subprocess.Popen, log: pathlib.Path):
    """The client's tokens; fails with the server's log if either gives up."""
    deadline = time.monotonic() + READY_TIMEOUT_S + 60
    while client.poll() is None and server.poll() is None:
        assert time.monotonic() < deadline, f"no answer in time:\n{log_tail(log)}"
        time.sleep(1)
    out, err = client.communicate(timeout=60)
    assert client.returncode == 0, f"{err[-2000:]}\nserver log:\n{log_tail(log)}"
    return [json.loads(line) for line in out.splitlines()]


def stop_server(server: subprocess.Popen) -> None:
    """Ctrl-C, as a user stops it; its Ray actors must go with it."""
    os.killpg(server.pid, signal.SIGINT)
    try:
        server.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        raise


def wait_for_no_workers(nodes: tuple[ray_nodes.Node, ...]) -> None:
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while any(ray_nodes.ray_workers(node) for node in nodes):
        assert time.monotonic() < deadline, "Ray workers outlived the server"
        time.sleep(1)


def serve_and_ask(nodes, cluster_env, layout, log: pathlib.Path) -> list[list[int]]:
    """`vllm serve` on the head with ``layout``: its answers, once checked that
    each node runs one of its two workers; then stopped."""
    head = nodes[0]
    with log.open("wb") as log_file:
        server = subprocess.Popen(
            serve_command(head, layout),
            env=head.env(cluster_env),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        client = subprocess.Popen(
            client_command(head), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        tokens = answers(server, client, log)
        placed = [len(ray_nodes.ray_workers(node)) for node in nodes]
        assert placed == [1, 1], f"{layout}: workers per node {placed}"
    finally:
        stop_server(server)
    wait_for_no_workers(nodes)
    return tokens


@pytest.mark.timeout(900)
def test_serve_across_two_ray_nodes_matches_single_node(tmp_path):
    expected = hf_greedy(model_path(MODEL), PROMPTS, MAX_TOKENS, torch.float32)
    with (
        ray_nodes.two_namespaces() as nodes,
        ray_nodes.ray_cluster(nodes) as cluster_env,
    ):
        for layout in LAYOUTS:
            log = tmp_path / f"serve-{layout}.log"
            tokens = serve_and_ask(nodes, cluster_env, layout, log)
            assert tokens == expected, layout
