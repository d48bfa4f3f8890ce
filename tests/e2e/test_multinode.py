"""Multi-node over Ray, as README_GAUDI's multi-node section runs it: two Ray
nodes on this machine, each in its own network namespace with its own address
and one emulated HPU (tests/e2e/ray_nodes.py), and an engine on the head with
``distributed_executor_backend="ray"``, first with two pipeline stages, then
with tensor parallelism of two, on the same cluster (one driver process: one
vLLM import). Each layout must place one worker in each node's namespace and
answer transformers' greedy tokens (which equal the single-node engine's:
test_generate; test_parallel checks chunked steps under TP and PP with the mp
executor). These are the suite's Ray tensor and pipeline parallel engines, and
the second engine on the cluster checks that the first gave its placement group
back (ray_cluster.py).

Needs root (network namespaces): it fails, never skips, without it.
"""

import ast
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from models import model_path

from e2e import ray_nodes
from e2e.harness import KV_CACHE_BYTES, hf_greedy, random_prompts

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
PROMPTS = random_prompts([5, 30], 1024, seed=7)
MAX_TOKENS = 8
LAYOUTS = {
    "pp2": {"pipeline_parallel_size": 2},  # one stage per node
    "tp2": {"tensor_parallel_size": 2},  # every layer split over the nodes
}
ENGINE_KWARGS = {
    "dtype": "float32",
    "seed": 0,
    "enforce_eager": True,
    "block_size": 16,
    "max_model_len": 256,
    "kv_cache_memory_bytes": KV_CACHE_BYTES,
    "distributed_executor_backend": "ray",
}
DRIVER_TIMEOUT_S = 600  # vLLM imported by the driver and four Ray actors

# Run on the head node: per layout, each rank's network namespace and the
# greedy tokens, then an orderly shutdown (the engine leaves the cluster).
DRIVER = f"""
import os
from vllm import LLM, SamplingParams

def namespace(worker):
    return os.readlink("/proc/self/ns/net")

def main():
    params = SamplingParams(temperature=0.0, max_tokens={MAX_TOKENS}, ignore_eos=True)
    prompts = [{{"prompt_token_ids": p}} for p in {PROMPTS!r}]
    for layout, kwargs in {LAYOUTS!r}.items():
        llm = LLM(model={model_path(MODEL)!r}, **{ENGINE_KWARGS!r}, **kwargs)
        print("RANKS", layout, llm.collective_rpc(namespace), flush=True)
        outputs = llm.generate(prompts, params)
        print("TOKENS", layout, [list(o.outputs[0].token_ids) for o in outputs])
        llm.llm_engine.engine_core.shutdown()
        del llm

if __name__ == "__main__":
    main()
"""


def printed(stdout: str, key: str) -> dict[str, list]:
    """``key layout value`` lines of the driver, by layout."""
    found = {}
    for line in stdout.splitlines():
        if line.startswith(f"{key} "):
            _, layout, value = line.split(" ", 2)
            found[layout] = ast.literal_eval(value)
    return found


def namespace_id(node: ray_nodes.Node) -> str:
    return f"net:[{os.stat(f'/run/netns/{node.namespace}').st_ino}]"


@pytest.mark.timeout(DRIVER_TIMEOUT_S + 300)
def test_engine_across_two_ray_nodes_matches_single_node():
    expected = hf_greedy(model_path(MODEL), PROMPTS, MAX_TOKENS, torch.float32)
    with (
        ray_nodes.two_namespaces() as nodes,
        ray_nodes.ray_cluster(nodes) as cluster_env,
    ):
        head = nodes[0]
        driver = subprocess.run(
            head.command(sys.executable, "-c", textwrap.dedent(DRIVER)),
            env={**head.env(cluster_env), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
            capture_output=True,
            text=True,
            timeout=DRIVER_TIMEOUT_S,
        )
        assert driver.returncode == 0, driver.stderr[-4000:]
        workers_left = ray_nodes.wait_for_no_workers(nodes)
        one_per_node = sorted(namespace_id(node) for node in nodes)
    ranks = printed(driver.stdout, "RANKS")
    placed = {layout: sorted(namespaces) for layout, namespaces in ranks.items()}
    assert placed == dict.fromkeys(LAYOUTS, one_per_node)
    assert printed(driver.stdout, "TOKENS") == dict.fromkeys(LAYOUTS, expected)
    assert not workers_left, "the engines' Ray workers outlived them"
