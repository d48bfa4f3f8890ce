"""Gaudi users' commands, as the reference README gives them: ``--device hpu``,
``device="hpu"``, Ray started by vLLM itself, and an engine started with vLLM's
default engine process from a process that already ran torch work.

Ray clusters are started only by the engine under test or by a fixture here, and
every one is shut down before the test ends.
"""

import ast
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import httpx
import psutil
import pytest
import ray
import torch
from models import model_path

from e2e.harness import hf_greedy, random_prompts, vllm_engine, vllm_greedy
from e2e.server import TINY_LLAMA_SERVER, uses_servers

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
VOCAB_SIZE = 1024
MAX_TOKENS = 8
PROMPTS = random_prompts([5, 30], VOCAB_SIZE, seed=7)
ENGINE_KWARGS = {"block_size": 16, "max_model_len": 256, "enforce_eager": True}
# A child imports vLLM and starts an engine process (under Ray, two workers too)
# on 2 cores shared with another test worker: a fresh clone measured over 300 s.
CHILD_TIMEOUT_S = 600
# vLLM alone would wait 30 minutes for a placement group it cannot get; with the
# check, an engine in this process fails before it loads the model.
RAY_FAILURE_BOUND_S = 60.0
NO_GAUDI = "--device hpu: no Gaudi found"
RAY_MARK = "HPU_TEST_RAY_MARK"  # tells this test's Ray processes from others'
HOW_TO_EMULATE = "set VLLM_HPU_EMULATION=1"


def child_env(**changes: str | None) -> dict[str, str]:
    """This process's environment with vLLM's default engine process (its own)."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    for name, value in changes.items():
        env.pop(name, None)
        if value is not None:
            env[name] = value
    return env


def child_command(code: str) -> list[str]:
    """``code`` for a fresh interpreter, under a main guard (engines spawn)."""
    script = "def main():\n" + textwrap.indent(textwrap.dedent(code), "    ")
    script += "\n\nif __name__ == '__main__':\n    main()\n"
    return [sys.executable, "-c", script]


def run_child(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return run_together([child_command(code)], env)[0]


def run_together(
    commands: list[list[str]], env: dict[str, str]
) -> list[subprocess.CompletedProcess]:
    """Commands run side by side (each spends seconds importing vLLM), each in
    its own process group: one past the timeout is killed with the engine
    processes it started, which would otherwise outlive the test."""
    children = [
        subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for command in commands
    ]
    done = []
    try:
        for command, child in zip(commands, children, strict=True):
            out, err = child.communicate(timeout=CHILD_TIMEOUT_S)
            result = subprocess.CompletedProcess(command, child.returncode, out, err)
            done.append(result)
    finally:
        for child in children:
            if child.poll() is None:  # past the timeout
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    return done


def generate_code(engine_kwargs: str) -> str:
    """Child code: an engine with ``engine_kwargs``, greedy tokens printed, then
    an orderly shutdown (the engine process stops any Ray it started)."""
    return f"""
    from vllm import LLM, SamplingParams
    llm = LLM(model={model_path(MODEL)!r}, dtype="float32", seed=0,
              kv_cache_memory_bytes=64 << 20, **{ENGINE_KWARGS!r}, {engine_kwargs})
    params = SamplingParams(temperature=0.0, max_tokens={MAX_TOKENS}, ignore_eos=True)
    outputs = llm.generate([{{"prompt_token_ids": p}} for p in {PROMPTS!r}], params)
    print("TOKENS", [list(o.outputs[0].token_ids) for o in outputs], flush=True)
    llm.llm_engine.engine_core.shutdown()
    """


def tokens_printed(result: subprocess.CompletedProcess) -> list[list[int]]:
    lines = [line for line in result.stdout.splitlines() if line.startswith("TOKENS")]
    assert lines, f"no tokens (rc {result.returncode}):\n{result.stderr[-3000:]}"
    return ast.literal_eval(lines[-1].removeprefix("TOKENS "))


@pytest.fixture
def reference_tokens() -> list[list[int]]:
    """Transformers' greedy tokens (cached on disk; test_generate checks the
    plugin's engine gives them for these settings)."""
    return hf_greedy(model_path(MODEL), PROMPTS, MAX_TOKENS, torch.float32)


def test_llm_device_hpu_generates_the_same_tokens(reference_tokens):
    with vllm_engine(model_path(MODEL), device="hpu", **ENGINE_KWARGS) as llm:
        assert vllm_greedy(llm, PROMPTS, MAX_TOKENS) == reference_tokens


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_llm_wrong_device_is_refused(device):
    from vllm import LLM

    with pytest.raises(ValueError, match=f"--device {device}: vLLM runs on the HPU"):
        LLM(model=model_path(MODEL), device=device)


def test_without_gaudi_or_emulation_device_hpu_fails_at_once():
    command = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]
    served, built = run_together(
        [
            [*command, model_path(MODEL), "--device", "hpu"],
            child_command(
                f"from vllm import LLM\nLLM({model_path(MODEL)!r}, device='hpu')"
            ),
        ],
        child_env(VLLM_HPU_EMULATION=None),
    )
    assert served.returncode != 0
    (line,) = [x for x in served.stderr.splitlines() if NO_GAUDI in x]
    assert HOW_TO_EMULATE in line
    assert built.returncode != 0
    assert f"ValueError: {NO_GAUDI}" in built.stderr
    assert HOW_TO_EMULATE in built.stderr


@pytest.mark.other_vllm
@uses_servers(TINY_LLAMA_SERVER)  # --device hpu, the engine in its own process
def test_serve_device_hpu_answers_a_completion(server_url, reference_tokens):
    body = {
        "model": MODEL,
        "prompt": PROMPTS[0],
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    reply = httpx.post(f"{server_url}/v1/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["token_ids"] == reference_tokens[0]


def ray_processes(mark: str) -> list[psutil.Process]:
    """Ray's daemons and agents (ray::...) alive with ``mark`` in their
    environment: those started under one child, not other users' clusters."""
    found = []
    for proc in psutil.process_iter(["name", "status"]):
        name = proc.info["name"] or ""
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if name in ("gcs_server", "raylet") or name.startswith("ray::"):
            with contextlib.suppress(psutil.Error):
                if proc.environ().get(RAY_MARK) == mark:
                    found.append(proc)
    return found


# Child code, indented as generate_code's: torch's thread pool started.
WARM_TORCH = f"""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained({model_path(MODEL)!r})
    with torch.no_grad():
        model(input_ids=torch.tensor([{PROMPTS[1]!r}]))
    """


@pytest.mark.other_vllm
def test_ray_tp2_engine_in_its_own_process_after_torch_work(reference_tokens):
    """No cluster started here: the engine process starts Ray with two emulated
    HPUs declared, and stops it when it shuts down. A transformers forward first
    starts torch's thread pool in the calling process; a forked engine would then
    hang, so the platform has vLLM spawn it (one child checks both: each costs a
    fresh vLLM import)."""
    mark = uuid.uuid4().hex
    env = child_env(
        VLLM_WORKER_MULTIPROC_METHOD=None, RAY_ADDRESS=None, **{RAY_MARK: mark}
    )
    result = run_child(
        WARM_TORCH
        + generate_code('tensor_parallel_size=2, distributed_executor_backend="ray"'),
        env,
    )
    assert tokens_printed(result) == reference_tokens
    deadline = time.monotonic() + 60  # Ray's agents notice their raylet is gone
    while ray_processes(mark) and time.monotonic() < deadline:
        time.sleep(1)
    assert not ray_processes(mark), "the engine left a Ray cluster running"


@pytest.fixture
def cluster_without_hpus():
    """A Ray cluster with CPUs only, as on a node where Ray found no Gaudi, this
    process its driver (the engine's executor finds Ray initialised)."""
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        yield
    finally:
        ray.shutdown()


def test_ray_cluster_without_hpus_fails_in_bounded_time(cluster_without_hpus):
    started = time.monotonic()
    with (
        pytest.raises(RuntimeError, match="offers 0 HPU resource") as refused,
        vllm_engine(
            model_path(MODEL),
            tensor_parallel_size=2,
            distributed_executor_backend="ray",
            **ENGINE_KWARGS,
        ),
    ):
        pass
    assert time.monotonic() - started < RAY_FAILURE_BOUND_S
    assert "this engine needs 2" in str(refused.value)
    assert """ray start --head --resources='{"HPU": 2}'""" in str(refused.value)
