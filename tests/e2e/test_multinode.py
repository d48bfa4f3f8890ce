"""Multi-node over Ray, as README_GAUDI's multi-node section runs it: two Ray
nodes on this machine, each in its own network namespace with its own address
and one emulated HPU (tests/e2e/ray_nodes.py), and `vllm serve` on the head with
``--distributed-executor-backend ray``, first with two pipeline stages, then
with tensor parallelism of two, on the same cluster. Each server must place one
Ray worker in each node's namespace, answer transformers' greedy tokens (which
equal the single-node engine's: test_generate; test_parallel checks chunked
steps under TP and PP with the mp executor), stop within a bound on SIGTERM
and leave no process behind, its Ray workers included. These are the suite's
Ray tensor and pipeline parallel engines; the second server on the cluster
checks that the first gave its placement group back (ray_cluster.py).

Needs root (network namespaces): it fails, never skips, without it.
"""

import json
import subprocess
import sys
import time

import pytest
import torch
from models import model_path

from e2e import ray_nodes
from e2e.harness import hf_greedy, random_prompts
from e2e.server import log_tail, serve_command, stop

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
PROMPTS = random_prompts([5, 30], 1024, seed=7)
MAX_TOKENS = 8
PORT = 8000  # the head namespace's own: nothing else listens there
SERVE_ARGS = [
    *("--served-model-name", MODEL, "--distributed-executor-backend", "ray"),
    *("--dtype", "float32", "--seed", "0", "--enforce-eager"),
    *("--block-size", "16", "--max-model-len", "256"),
]
LAYOUTS = {
    "pp2": ["--pipeline-parallel-size", "2"],  # one stage per node
    "tp2": ["--tensor-parallel-size", "2"],  # every layer split over the nodes
}
# The server and its engine core import vLLM, then two Ray workers do, on a
# busy 2-core machine.
READY_TIMEOUT_S = 400
SHUTDOWN_BOUND_S = 30.0

# Run in the head's namespace, where the server listens: waits for it, then
# prints the prompts' greedy tokens (one batch request, tokens as ids).
CLIENT = """
import json, sys, time, httpx
url, body, timeout = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + timeout
while True:
    try:
        if httpx.get(url + "/health", timeout=5).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    if time.monotonic() > deadline:
        raise SystemExit(f"no server at {url} after {timeout} s")
    time.sleep(1)
reply = httpx.post(url + "/v1/completions", json=body, timeout=120)
reply.raise_for_status()
choices = sorted(reply.json()["choices"], key=lambda c: c["index"])
print(json.dumps([c["token_ids"] for c in choices]))
"""


def start_server(head: ray_nodes.Node, env: dict[str, str], layout: str, log):
    """`vllm serve` in the head's namespace, in its own process group, with
    exactly the head node's variables (no loopback gloo interface inherited)."""
    command = serve_command(model_path(MODEL), PORT, SERVE_ARGS + LAYOUTS[layout])
    with log.open("wb") as log_file:
        return subprocess.Popen(
            head.command(*command),
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def ask(head: ray_nodes.Node, server: subprocess.Popen, log) -> list[list[int]]:
    """PROMPTS' tokens from a client on the head; fails with the server's log
    if the server exits or the client gives up."""
    body = {
        "model": MODEL,
        "prompt": PROMPTS,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    url = f"http://127.0.0.1:{PORT}"
    args = [url, json.dumps(body), str(READY_TIMEOUT_S)]
    client = subprocess.Popen(
        head.command(sys.executable, "-c", CLIENT, *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while client.poll() is None:
            assert server.poll() is None, f"vllm serve exited:\n{log_tail(log)}"
            time.sleep(1)
    finally:
        if client.poll() is None:
            client.kill()
    out, err = client.communicate()
    assert client.returncode == 0, f"{err[-2000:]}\nserver log:\n{log_tail(log)}"
    return json.loads(out)


def serve_layout(nodes, cluster_env, layout: str, log) -> dict:
    """One server's answers, its Ray workers per node while it ran, how long
    SIGTERM took to stop it and what outlived it."""
    head = nodes[0]
    server = start_server(head, head.env(cluster_env), layout, log)
    try:
        tokens = ask(head, server, log)
        placed = [len(ray_nodes.ray_workers(node)) for node in nodes]
    finally:
        started = time.monotonic()
        left = stop(server)  # SIGTERM to the group; SIGKILL past STOP_TIMEOUT_S
        stopped_s = time.monotonic() - started
    left += ray_nodes.wait_for_no_workers(nodes)
    return {"tokens": tokens, "placed": placed, "stopped_s": stopped_s, "left": left}


@pytest.mark.other_vllm
@pytest.mark.timeout(2 * READY_TIMEOUT_S + 300)
def test_serve_across_two_ray_nodes_matches_single_node(tmp_path):
    expected = hf_greedy(model_path(MODEL), PROMPTS, MAX_TOKENS, torch.float32)
    with (
        ray_nodes.two_namespaces() as nodes,
        ray_nodes.ray_cluster(nodes) as cluster_env,
    ):
        for layout in LAYOUTS:
            log = tmp_path / f"serve-{layout}.log"
            run = serve_layout(nodes, cluster_env, layout, log)
            assert run["placed"] == [1, 1], f"{layout}: Ray workers per node"
            assert run["tokens"] == expected, layout
            assert not run["left"], f"{layout}: processes left: {run['left']}"
            assert run["stopped_s"] < SHUTDOWN_BOUND_S, (layout, run["stopped_s"])
