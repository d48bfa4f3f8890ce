"""Whole engines on the Gaudi branch under the bridge's test double, the ways
users start them: ``LLM(...)`` with its engine and workers in processes of
their own, and ``vllm serve``. Greedy tokens (and logprobs) equal
transformers' (float32), and the double's acquisition log shows that only
engine processes take a card: a front end (the caller of ``LLM``, the API
server) that took one would hold it for its life, one card fewer for the
workers (review item D4). The hosts have exactly the cards the engines need,
so a front end holding one would also stop the start-up ("Device acquire
failed")."""

import json
import pathlib
import re
from typing import Any

import httpx
import pytest
import torch
from e2e.harness import hf_greedy, random_prompts
from e2e.server import free_port, launch, serve_command, stop, wait_until_ready
from gaudi_process import run_python
from models import model_path

MODEL = "tiny-llama"
MAX_TOKENS = 8


def double_host(tmp_path: pathlib.Path, cards: int) -> dict[str, str]:
    """A host of ``cards`` cards of its own, its acquisitions logged; the
    engines' processes as users get them (multiprocessing on)."""
    return {
        "HPU_DOUBLE_CARDS": str(cards),
        "HPU_DOUBLE_STATE_DIR": str(tmp_path),
        "HPU_DOUBLE_ACQUIRE_LOG": str(tmp_path / "acquired.jsonl"),
        "HPU_DOUBLE_MEMORY_MIB": "1024",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
    }


def acquisitions(tmp_path: pathlib.Path) -> list[dict[str, Any]]:
    log = tmp_path / "acquired.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()]


def assert_only_engines_took_cards(
    entries: list[dict[str, Any]], front_end: int, cards: int
) -> None:
    """Every card was taken once, each by another process, none by the front
    end (``front_end``'s pid); an attempt that failed is shown whole."""
    refused = [e for e in entries if not e["acquired"]]
    assert not refused, refused
    takers = {e["pid"]: e for e in entries}
    assert front_end not in takers, takers[front_end]
    assert sorted(e["module_id"] for e in takers.values()) == list(range(cards))


# Mixed lengths (70: more than the 64-token step budget, chunked) in a KV cache
# of 8 blocks of 16 tokens (7 for requests): the longest outgrows the cache as
# it decodes and a request is preempted. Then prompts repeating the first 48
# and the third's first 16 tokens: cached blocks, prefix hits. vLLM's counters
# (the caller's, which vLLM keeps from the engine's stats) show both.
PROMPTS = random_prompts([70, 5, 20, 12], 1024, seed=3)
LATER = [[*PROMPTS[0][:48], 7, 8, 9], [*PROMPTS[2][:16], 7, 8, 9]]
OFFLINE_TOKENS = 16

OFFLINE = """
import json, os
from vllm import LLM, SamplingParams

llm = LLM(os.environ["MODEL"], tensor_parallel_size=2, dtype="float32", seed=0,
          enforce_eager=True, block_size=16, num_gpu_blocks_override=8,
          max_model_len=112, max_num_batched_tokens=64, max_num_seqs=4,
          disable_log_stats=False)
params = SamplingParams(temperature=0.0, max_tokens=int(os.environ["MAX_TOKENS"]),
                        ignore_eos=True)
counted = ("vllm:num_preemptions", "vllm:prefix_cache_hits")

def counters():
    return {m.name: m.value for m in llm.get_metrics() if m.name in counted}

tokens, grew = [], []
for batch in ("PROMPTS", "LATER"):
    before = counters()
    prompts = json.loads(os.environ[batch])
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    tokens += [list(o.outputs[0].token_ids) for o in outputs]
    after = counters()
    grew.append({name: after[name] - before.get(name, 0) for name in after})
print("RESULT", json.dumps({"pid": os.getpid(), "tokens": tokens, "grew": grew}),
      flush=True)
"""


@pytest.mark.timeout(900)
def test_llm_tensor_parallel_generates_what_transformers_does(tmp_path):
    """``LLM(..., tensor_parallel_size=2)`` as users run it (engine core and
    two workers in processes of their own) on a two-card host: mixed lengths,
    a chunked prompt, a preemption, then prefix hits; the caller takes no
    card."""
    expected = hf_greedy(
        model_path(MODEL), PROMPTS + LATER, OFFLINE_TOKENS, torch.float32
    )
    out = run_python(
        OFFLINE,
        timeout=800,
        MODEL=model_path(MODEL),
        PROMPTS=json.dumps(PROMPTS),
        LATER=json.dumps(LATER),
        MAX_TOKENS=str(OFFLINE_TOKENS),
        **double_host(tmp_path, cards=2),
    )
    (line,) = [line for line in out.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["tokens"] == expected
    first, later = result["grew"]
    assert first["vllm:num_preemptions"] > 0, result["grew"]
    assert later["vllm:prefix_cache_hits"] > 0, result["grew"]
    assert_only_engines_took_cards(acquisitions(tmp_path), result["pid"], cards=2)


SERVE_ARGS = [
    *("--dtype", "float32", "--seed", "0", "--enforce-eager"),
    *("--max-model-len", "128", "--max-num-batched-tokens", "128"),
    *("--max-num-seqs", "4", "--data-parallel-size", "2"),
    *("--api-server-count", "1", "--distributed-executor-backend", "uni"),
]
SERVE_PROMPTS = random_prompts([6, 21], 1024, seed=4)
TOP_LOGPROBS = 2


def hf_logprobs(prompt: list[int], tokens: list[int]) -> list[dict[int, float]]:
    """transformers' float32 log-probabilities of the top TOP_LOGPROBS tokens
    at each generated position."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path(MODEL), dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0]
    steps = logits[len(prompt) - 1 : -1].log_softmax(-1)
    top = steps.topk(TOP_LOGPROBS, dim=-1)
    return [
        dict(zip(ids.tolist(), values.tolist(), strict=True))
        for values, ids in zip(top.values, top.indices, strict=True)
    ]


def completion(url: str, prompt: list[int]) -> tuple[list[int], list[dict[int, float]]]:
    """Greedy tokens and their top logprobs, ids as integers."""
    reply = httpx.post(
        f"{url}/v1/completions",
        json={
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
            "ignore_eos": True,
            "logprobs": TOP_LOGPROBS,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
        },
        timeout=120,
    )
    reply.raise_for_status()
    (choice,) = reply.json()["choices"]
    top = [
        {int(token.removeprefix("token_id:")): value for token, value in step.items()}
        for step in choice["logprobs"]["top_logprobs"]
    ]
    return choice["token_ids"], top


@pytest.mark.timeout(900)
def test_serve_data_parallel_logprobs_equal_transformers(tmp_path):
    """``vllm serve --data-parallel-size 2`` on a two-card host: each engine
    core takes a card, the API server none; requests with logprobs (vLLM
    compiles their rank count with the platform's backend: review item D9)
    answer transformers' tokens and log-probabilities."""
    port = free_port()
    args = ["--served-model-name", MODEL, *SERVE_ARGS]
    command = serve_command(model_path(MODEL), port, args)
    process = launch(command, double_host(tmp_path, cards=2), tmp_path / "server.log")
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_ready(process, url, tmp_path / "server.log", timeout_s=600)
        answers = [completion(url, prompt) for prompt in SERVE_PROMPTS]
    finally:
        left = stop(process)
    assert not left, f"processes left after shutdown: {left}"
    expected = hf_greedy(model_path(MODEL), SERVE_PROMPTS, MAX_TOKENS, torch.float32)
    assert [tokens for tokens, _ in answers] == expected
    for prompt, (tokens, top) in zip(SERVE_PROMPTS, answers, strict=True):
        want = hf_logprobs(prompt, tokens)
        assert [sorted(step) for step in top] == [sorted(step) for step in want]
        for got_step, want_step in zip(top, want, strict=True):
            for token, value in want_step.items():
                assert got_step[token] == pytest.approx(value, abs=1e-3)
    entries = acquisitions(tmp_path)
    assert_only_engines_took_cards(entries, process.pid, cards=2)
    assert all("EngineCore" in e["process"] for e in entries), entries


LAZY = """
import json, os
from vllm import LLM, SamplingParams

llm = LLM(os.environ["MODEL"], dtype="float32", seed=0, max_model_len=128,
          max_num_seqs=4, max_num_batched_tokens=128)
params = SamplingParams(temperature=0.0, max_tokens=int(os.environ["MAX_TOKENS"]),
                        ignore_eos=True)
prompts = json.loads(os.environ["PROMPTS"])
outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
print("RESULT", json.dumps([list(o.outputs[0].token_ids) for o in outputs]), flush=True)
"""
LAZY_PROMPTS = random_prompts([7, 30, 19], 1024, seed=5)


@pytest.mark.timeout(900)
def test_lazy_mode_graph_replays_read_each_steps_metadata(tmp_path):
    """Lazy mode with HPU graphs (``PT_HPU_LAZY_MODE=1``, graphs on): decode
    buckets captured at warmup, replayed for every step with that step's
    slots, blocks and positions as graph inputs (review item D5: a replay of
    the capture-time metadata writes each step's keys to the warmup's slots,
    and tiny Llama's tokens differ from transformers' from the second on)."""
    expected = hf_greedy(model_path(MODEL), LAZY_PROMPTS, MAX_TOKENS, torch.float32)
    out = run_python(
        LAZY,
        timeout=800,
        MODEL=model_path(MODEL),
        PROMPTS=json.dumps(LAZY_PROMPTS),
        MAX_TOKENS=str(MAX_TOKENS),
        PT_HPU_LAZY_MODE="1",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        HPU_DOUBLE_STATE_DIR=str(tmp_path),
        HPU_DOUBLE_MEMORY_MIB="1024",
    )
    captured = re.findall(r"Graph/Decode captured:(\d+)", out)
    assert captured and int(captured[-1]) > 0, out[-3000:]
    (line,) = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert json.loads(line.removeprefix("RESULT ")) == expected
