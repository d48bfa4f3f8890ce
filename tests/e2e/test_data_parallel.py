"""Data, expert and tensor parallelism in emulation (issue 34): vLLM's offline
data-parallel pattern (one process per rank) and ``vllm serve
--data-parallel-size 2`` must answer as one replica does, greedy; a MoE model's
ranks exchange tokens in every layer (distributed.py), a rank without requests
joining with idle passes. Without expert parallelism each rank holds half of
every expert (vLLM shards experts over the data-parallel ranks, or over the
tensor-parallel ranks); with --enable-expert-parallel, half of the experts:
each expert-parallel test reports which experts every rank holds and the
(token, expert) pairs its experts took, from the routed experts the engine
returns (its own router's choices, expert_ranks.py), and asserts both ranks
worked. DeepSeek-V2's layout (latent attention, a shared expert beside the
routed ones) runs tensor and expert parallel too (with both tensor and data
parallelism: tests/e2e/test_expert_parallel.py).

A dense model's data-parallel ranks are independent replicas: vLLM 0.32 serves
them behind one API server (internal load balancing, tested on tiny Llama) and
refuses the rest, offline ("Offline data parallel mode is not supported/useful
for dense models", vllm/config/parallel.py) and with external load balancing
("Non-MoE models do not support external data parallel mode",
vllm/engine/arg_utils.py): there, users start independent instances.

Each process importing vLLM costs seconds: the offline ranks run their engines
in-process (vLLM's LLMEngine joins the data-parallel group itself), the servers
start their engine cores as users get them (the dense one without worker
processes). The offline run (DeepSeek-V2, expert parallel, one rank idle
most steps, compiled: nothing compiles after warmup) and the MoE servers (tiny
Mixtral, experts sharded) cover both ways of holding experts.
"""

import json
import os
import pathlib
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from models import model_path

from e2e.expert_ranks import (
    assert_same_experts,
    experts_held,
    greedy_routed,
    pairs_per_rank,
    transformers_routing,
)
from e2e.harness import (
    KV_CACHE_BYTES,
    compiled_graphs,
    hf_greedy,
    one_bucket,
    random_prompts,
    vllm_engine,
)
from e2e.server import (
    free_port,
    group_members,
    launch,
    serve_command,
    stop,
    wait_until_ready,
)

DENSE_MODEL = "tiny-llama"  # 2 layers, no experts
MOE_MODEL = "tiny-mixtral"  # 4 experts, top 2, 2 layers
# MLA; 4 routed experts (top 2) and a shared one in its second layer
MLA_MOE_MODEL = "tiny-deepseek-v2-moe"
NUM_EXPERTS = 4  # routed experts of both models
VOCAB_SIZE = 1024
MAX_TOKENS = 16
# As test_parallel's: a 64-token step budget chunks the long prompt while the
# short ones decode.
ENGINE_KWARGS = {"block_size": 16, "max_num_batched_tokens": 64}
PROMPTS = random_prompts([1, 17, 40, 100], VOCAB_SIZE, seed=3)
# Rank 0 gets the long prompts, rank 1 one short request of few tokens: rank 1
# has nothing to do for most steps and joins rank 0's passes idle.
RANK_SHARES = ([0, 2, 3], [1])
SHORT_MAX_TOKENS = 3
RANK_TIMEOUT_S = 400
# A DP=2 MoE server starts six processes, each importing vLLM, and its engine
# cores wait for each other: CI measured 300 s beside another test worker.
SERVE_READY_TIMEOUT_S = 600
SHUTDOWN_BOUND_S = 30.0


def _max_tokens(rank: int) -> list[int]:
    return [SHORT_MAX_TOKENS if rank else MAX_TOKENS] * len(RANK_SHARES[rank])


def _rank_env(rank: int, port: int) -> dict[str, str]:
    return {
        "VLLM_DP_RANK": str(rank),
        "VLLM_DP_RANK_LOCAL": str(rank),
        "VLLM_DP_SIZE": "2",
        "VLLM_DP_MASTER_IP": "127.0.0.1",
        "VLLM_DP_MASTER_PORT": str(port),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }


def offline_data_parallel(
    name: str, engine: dict, workdir: pathlib.Path, env: dict[str, str]
) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """PROMPTS' tokens from two rank processes started together, in PROMPTS'
    order; each rank's graphs compiled in warmup and while generating; and
    the (token, expert) pairs each expert-parallel rank's experts took, from
    the routed experts the engines return (expert_ranks.py), which are
    checked against transformers' router on the same tokens."""
    port = free_port()
    script = pathlib.Path(__file__).with_name("dp_rank.py")
    defaults = {"dtype": "float32", "kv_cache_memory_bytes": KV_CACHE_BYTES}
    engine = defaults | {"max_model_len": 1024, "seed": 0} | engine
    ranks = []
    for rank, share in enumerate(RANK_SHARES):
        request = {
            "engine": engine,
            "prompts": [PROMPTS[i] for i in share],
            "max_tokens": _max_tokens(rank),
        }
        command = [sys.executable, str(script), model_path(name)]
        log = workdir / f"rank{rank}.log"
        rank_env = _rank_env(rank, port) | env
        ranks.append((launch([*command, json.dumps(request)], rank_env, log), log))
    deadline = time.monotonic() + RANK_TIMEOUT_S
    try:
        for process, _ in ranks:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for process, _ in ranks:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    tokens: list[list[int]] = [[] for _ in PROMPTS]
    routed: list[np.ndarray] = [np.zeros(0) for _ in PROMPTS]
    compiled, held = [], []
    for rank, (process, log) in enumerate(ranks):
        text = log.read_text(errors="replace")
        assert process.returncode == 0, f"rank {rank} failed:\n{text[-4000:]}"
        outputs = zip(
            json.loads(_printed(text, "TOKENS ")),
            json.loads(_printed(text, "ROUTED ")),
            strict=True,
        )
        for index, (generated, rows) in zip(RANK_SHARES[rank], outputs, strict=True):
            tokens[index], routed[index] = generated, np.array(rows)
        compiled.append(json.loads(_printed(text, "COMPILED ")))
        for worker in json.loads(_printed(text, "HELD ")):
            held.append({int(layer): experts for layer, experts in worker.items()})
    check_routing(name, tokens, routed)
    pairs = pairs_per_rank(routed, held)
    print(f"{name}: experts per expert-parallel rank {held}, pairs {pairs}")
    return tokens, compiled, pairs


def check_routing(name: str, tokens: list[list[int]], routed: list[np.ndarray]) -> None:
    """Each request's routed experts are transformers' on its tokens."""
    for prompt, generated, rows in zip(PROMPTS, tokens, routed, strict=True):
        sequence = (prompt + generated)[:-1]
        assert rows.shape[0] == len(sequence), (rows.shape, len(sequence))
        assert_same_experts(rows, transformers_routing(model_path(name), sequence))


def _printed(log: str, key: str) -> str:
    return next(ln for ln in log.splitlines() if ln.startswith(key)).removeprefix(key)


def expected_from(single: list[list[int]]) -> list[list[int]]:
    """One card's tokens cut to what each rank asks for."""
    expected = list(single)
    for index in RANK_SHARES[1]:
        expected[index] = single[index][:SHORT_MAX_TOKENS]
    return expected


# Compiled emulation (dynamo's eager backend) with three buckets, each traced
# by every rank: prompt passes of 64 tokens with no context or up to 8 blocks
# of it (the long prompt's second chunk), decodes of 4 sequences of up to 32
# blocks in all. Each rank warms them up, the idle rank's dummy passes
# included, and compiles nothing while generating.
COMPILED_ENV = {
    "VLLM_HPU_COMPILE_BACKEND": "eager",
    **one_bucket("PROMPT_SEQ", 64),
    **one_bucket("PROMPT_BLOCK", 8),
    **one_bucket("DECODE_BS", 4),
    **one_bucket("DECODE_BLOCK", 32),
}
COMPILED_ENGINE = {"enforce_eager": False, "max_num_seqs": 4, "max_model_len": 256}
# Expert parallel, each request's routed experts returned: the evidence of
# which rank's experts took which (token, expert) pairs (expert_ranks.py).
EXPERT_PARALLEL = {"enable_expert_parallel": True, "enable_return_routed_experts": True}


# Offline on DeepSeek-V2's layout, the richer of the two MoE models (latent
# attention, a shared expert): tiny Mixtral's experts are split over
# data-parallel ranks by the external-LB servers below and over
# tensor-parallel ranks, expert parallel and compiled, in the next test.
@pytest.mark.timeout(900)
def test_offline_data_parallel_expert_parallel_matches_one_card(tmp_path):
    """vLLM refuses offline data parallelism for dense models ("not
    supported/useful"): MoE models only, each rank owning half of the experts."""
    name = MLA_MOE_MODEL
    single = hf_greedy(model_path(name), PROMPTS, MAX_TOKENS, torch.float32)
    engine = ENGINE_KWARGS | COMPILED_ENGINE | EXPERT_PARALLEL
    tokens, compiled, pairs = offline_data_parallel(
        name, engine, tmp_path, COMPILED_ENV
    )
    assert tokens == expected_from(single)
    assert len(pairs) == 2 and all(pairs), pairs  # both ranks' experts worked
    assert all(
        warmed > 0 and generating == 0
        for rank_warmed, rank_generating in compiled
        for warmed, generating in zip(rank_warmed, rank_generating, strict=True)
    ), compiled


# Without expert parallelism each rank holds half of every expert's intermediate
# size and the MoE layer's partial sums are all-reduced; with it, half of the
# experts (DeepSeek-V2's shared expert stays split over the ranks). Compared
# with transformers' tokens, which one replica equals (test_generate): a
# reference from a shared engine would be restarted after each fresh TP engine.
# Expert parallel runs compiled, as the offline data-parallel ones: each rank's
# worker compiles its buckets in warmup and nothing while generating.
@pytest.mark.parametrize(
    ("name", "expert_parallel"),
    [(MOE_MODEL, False), (MOE_MODEL, True), (MLA_MOE_MODEL, True)],
    ids=["experts-sharded", "expert-parallel", "deepseek-v2-expert-parallel"],
)
@pytest.mark.timeout(600)
def test_tensor_parallel_moe_matches_one_card(name, expert_parallel, hpu_env):
    expected = hf_greedy(model_path(name), PROMPTS, MAX_TOKENS, torch.float32)
    engine = dict(ENGINE_KWARGS)
    if expert_parallel:
        hpu_env(**COMPILED_ENV)  # read by the workers vLLM starts
        engine |= COMPILED_ENGINE | EXPERT_PARALLEL
    with vllm_engine(
        model_path(name),
        distributed_executor_backend="mp",
        tensor_parallel_size=2,
        **engine,
    ) as tp:
        warmed = tp.collective_rpc(graphs_compiled)
        tokens, routed = greedy_routed(tp, PROMPTS, MAX_TOKENS)
        held = tp.collective_rpc(experts_held)
        compiled = tp.collective_rpc(graphs_compiled)
        sizes = tp.collective_rpc(experts_stored)
    assert tokens == expected
    per_rank = NUM_EXPERTS // 2 if expert_parallel else NUM_EXPERTS
    assert [set(layers) for layers in sizes] == [{per_rank}] * 2, sizes
    if expert_parallel:
        check_routing(name, tokens, routed)
        pairs = pairs_per_rank(routed, held)
        print(f"{name}: experts per rank {held}, (token, expert) pairs {pairs}")
        # Halves of the experts, each pair taken by one rank, both working.
        for layer in held[0]:
            assert sorted(held[0][layer] + held[1][layer]) == list(range(NUM_EXPERTS))
        assert sum(pairs) == sum(r[:, list(held[0])].size for r in routed)
        assert all(pairs), pairs
        assert all(graphs > 0 for graphs in warmed) and compiled == warmed, (
            warmed,
            compiled,
        )


def graphs_compiled(worker: Any) -> int:
    """Graphs torch.compile compiled in this rank's worker process so far."""
    return compiled_graphs()


def experts_stored(worker: Any) -> list[int]:
    """How many experts each MoE layer of this rank holds weights for."""
    from vllm.model_executor.layers.fused_moe import RoutedExperts

    model = worker.model_runner.model
    return [
        m.w13_weight.shape[0] for m in model.modules() if isinstance(m, RoutedExperts)
    ]


# Both models served alike: float32, the 64-token step budget (the long prompt
# chunked while the short ones decode), two data-parallel ranks behind one API
# server (vLLM would start one per rank: fewer processes to start on a 2-core
# machine; it still balances over both engine cores).
SERVE_ARGS = [
    *("--dtype", "float32", "--seed", "0", "--enforce-eager"),
    *("--block-size", "16", "--max-num-batched-tokens", "64"),
    *("--max-model-len", "256", "--data-parallel-size", "2"),
    *("--api-server-count", "1"),
]


def _completions(
    url: str, name: str, prompts: list[list[int]] = PROMPTS
) -> list[list[int]]:
    """The prompts' greedy tokens in one batch request (tokens as ids)."""
    reply = httpx.post(
        f"{url}/v1/completions",
        json={
            "model": name,
            "prompt": prompts,
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
        timeout=120,
    )
    reply.raise_for_status()
    choices = sorted(reply.json()["choices"], key=lambda c: c["index"])
    return [c["token_ids"] for c in choices]


def requests_per_engine(url: str) -> dict[str, float]:
    """Requests each engine core finished, from the API server's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    finished: dict[str, float] = {}
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:request_success_total":
                engine = sample.labels["engine"]
                finished[engine] = finished.get(engine, 0.0) + sample.value
    return finished


# vLLM's two load-balancing modes, one model each (every server is several
# processes importing vLLM on a 2-core machine). tiny Llama is dense: vLLM runs
# its ranks as independent engine cores behind one API server (vllm/v1/engine/
# core.py, EngineCoreProc.run_engine_core: "Non-MoE DP ranks are completely
# independent"), each running the model in its own process (the uni executor:
# no worker processes); vLLM refuses external load balancing for dense models.
# tiny Mixtral's ranks meet in every MoE layer: one server per rank
# (test_serve_external_load_balancing_moe).
@pytest.mark.timeout(900)
def test_serve_data_parallel_matches_one_replica_and_shuts_down(tmp_path):
    """Two engine cores behind one API server (vLLM's internal load balancing)
    answer a batch as one replica (transformers' tokens), each finishing part
    of it; SIGTERM stops every process within SHUTDOWN_BOUND_S."""
    name = DENSE_MODEL
    expected = hf_greedy(model_path(name), PROMPTS, MAX_TOKENS, torch.float32)
    port = free_port()
    log = tmp_path / "server.log"
    args = ["--served-model-name", name, *SERVE_ARGS]
    args += ["--distributed-executor-backend", "uni"]
    command = serve_command(model_path(name), port, args)
    process = launch(command, {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}, log)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_ready(process, url, log, SERVE_READY_TIMEOUT_S)
        assert _completions(url, name) == expected
        finished = requests_per_engine(url)
        engines = [p for p in group_members(process.pid) if "EngineCore" in p.name()]
        assert len(engines) == 2, [p.name() for p in group_members(process.pid)]
    finally:
        started = time.monotonic()
        left = stop(process)  # SIGTERM; SIGKILL only past STOP_TIMEOUT_S
        stopped = time.monotonic() - started
    # The burst spreads over both engine cores; every request finished once.
    assert sorted(finished) == ["0", "1"] and 0 not in finished.values(), finished
    assert sum(finished.values()) == len(PROMPTS), finished
    assert not left, f"processes left after shutdown: {left}"
    assert stopped < SHUTDOWN_BOUND_S, f"shutdown took {stopped:.1f} s"


@pytest.mark.timeout(900)
def test_serve_external_load_balancing_moe(tmp_path):
    """vLLM's external load balancing: one `vllm serve` per data-parallel rank
    of tiny Mixtral (`--data-parallel-rank`), each its own API server and
    engine core, the ranks meeting in every MoE layer. All requests to rank 0
    (rank 1 idles through dummy passes), then some to each: transformers'
    tokens; SIGTERM stops both within SHUTDOWN_BOUND_S, nothing left."""
    expected = hf_greedy(model_path(MOE_MODEL), PROMPTS, MAX_TOKENS, torch.float32)
    rpc_port, ports = free_port(), [free_port(), free_port()]
    shared = ["--served-model-name", MOE_MODEL, *SERVE_ARGS]
    shared += ["--distributed-executor-backend", "uni"]
    shared += ["--data-parallel-address", "127.0.0.1"]
    shared += ["--data-parallel-rpc-port", str(rpc_port)]
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    logs = [tmp_path / f"rank{rank}.log" for rank in (0, 1)]
    servers = [
        launch(
            serve_command(
                model_path(MOE_MODEL),
                ports[rank],
                [*shared, "--data-parallel-rank", str(rank)],
            ),
            env,
            logs[rank],
        )
        for rank in (0, 1)
    ]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        for server, url, log in zip(servers, urls, logs, strict=True):
            wait_until_ready(server, url, log, SERVE_READY_TIMEOUT_S)
        assert _completions(urls[0], MOE_MODEL) == expected
        first, second = RANK_SHARES
        with ThreadPoolExecutor(2) as pool:
            both = pool.map(
                lambda url, share: _completions(
                    url, MOE_MODEL, [PROMPTS[i] for i in share]
                ),
                urls,
                RANK_SHARES,
            )
            split = list(both)
        assert split == [[expected[i] for i in share] for share in RANK_SHARES]
        finished = [requests_per_engine(url) for url in urls]
    finally:
        started = time.monotonic()
        left = [p for server in servers for p in stop(server)]
        stopped = time.monotonic() - started
    # Each API server sees its own engine core only.
    assert [sum(f.values()) for f in finished] == [
        len(PROMPTS) + len(first),
        len(second),
    ], finished
    assert not left, f"processes left after shutdown: {left}"
    assert stopped < 2 * SHUTDOWN_BOUND_S, f"shutdown took {stopped:.1f} s"
