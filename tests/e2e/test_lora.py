"""LoRA through vLLM on the plugin equals transformers with the adapter merged,
token for token in float32: adapters of different ranks and target modules, and
requests without an adapter, in the same batches, with prefix caching on."""

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch
from conftest import MODELS_DIR
from models import model_path as model_dir
from vllm import SamplingParams
from vllm.lora.request import LoRARequest

from e2e.harness import compiled_graphs, hf_greedy, random_prompts, vllm_engine
from e2e.lora_adapters import (
    ATTENTION,
    ATTENTION_MLP,
    AdapterSpec,
    build_adapter,
    merge_adapter,
    rename_target,
)
from e2e.server import vllm_server

pytestmark = pytest.mark.slow

MAX_TOKENS = 8
MAX_LORA_RANK = 16
# Adapter 1 low rank on attention; adapter 2 full rank on attention and MLP.
ADAPTERS = (AdapterSpec(4, ATTENTION, seed=1), AdapterSpec(16, ATTENTION_MLP, seed=2))
# Per prompt: the adapter it runs with (0: none); two prompts share a prefix.
PROMPT_LORAS = [1, 0, 2, 1, 2, 0]
LENGTHS = [20, 9, 33, 20, 5, 40]


def _prompts(name: str) -> list[list[int]]:
    vocab_size = json.loads((MODELS_DIR / name / "config.json").read_text())[
        "vocab_size"
    ]
    prompts = random_prompts(LENGTHS, vocab_size)
    prompts[3] = prompts[0][:16] + prompts[3][16:]  # a prefix-cache hit, adapter 1
    return prompts


GREEDY = {
    "max_tokens": MAX_TOKENS,
    "temperature": 0.0,
    "ignore_eos": True,
    "return_token_ids": True,
}
ENGINE = dict(
    enable_lora=True,
    max_loras=2,
    max_lora_rank=MAX_LORA_RANK,
    enable_prefix_caching=True,
    max_model_len=128,
)


@dataclass
class Case:
    """A model's adapters and what transformers generates with them merged."""

    base: str
    requests: list[LoRARequest | None]  # by adapter id; 0: none
    prompts: list[list[int]]
    expected: list[list[int]]


@functools.cache
def _case(name: str, out_dir: Path) -> Case:
    base = model_dir(name)
    adapters = [
        build_adapter(base, spec, out_dir / f"adapter{i}")
        for i, spec in enumerate(ADAPTERS, start=1)
    ]
    models = [base] + [
        merge_adapter(base, adapter, out_dir / f"merged{i}")
        for i, adapter in enumerate(adapters, start=1)
    ]
    prompts = _prompts(name)
    expected = [
        hf_greedy(models[lora_id], [prompt], MAX_TOKENS, torch.float32)[0]
        for prompt, lora_id in zip(prompts, PROMPT_LORAS, strict=True)
    ]
    # The adapters change what the model says, or the comparison shows nothing.
    assert expected[0] != hf_greedy(base, prompts[:1], MAX_TOKENS, torch.float32)[0]
    requests: list[LoRARequest | None] = [None]
    requests += [
        LoRARequest(f"adapter{i}", i, str(path))
        for i, path in enumerate(adapters, start=1)
    ]
    return Case(base, requests, prompts, expected)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("lora")
    return lambda name: _case(name, out_dir / name)


def lora_greedy(llm, case: Case) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    results = llm.generate(
        [{"prompt_token_ids": p} for p in case.prompts],
        params,
        lora_request=[case.requests[i] for i in PROMPT_LORAS],
    )
    return [list(r.outputs[0].token_ids) for r in results]


def check(case: Case, actual: list[list[int]]) -> None:
    for i, (want, got) in enumerate(zip(case.expected, actual, strict=True)):
        assert got == want, f"prompt {i} (adapter {PROMPT_LORAS[i]}) diverged"


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_lora_generations_match_merged_adapters(name, cases):
    case = cases(name)
    with vllm_engine(case.base, **ENGINE) as llm:
        check(case, lora_greedy(llm, case))


def test_more_adapters_than_max_loras_wait_their_turn(cases):
    """Two adapters in the batch, one slot: vLLM's scheduler keeps each step to
    max_loras distinct adapters, and every prompt still gets its own."""
    case = cases("tiny-llama")
    with vllm_engine(case.base, **(ENGINE | {"max_loras": 1})) as llm:
        check(case, lora_greedy(llm, case))


def test_lora_after_warmup_compiles_nothing(cases, hpu_env):
    hpu_env(VLLM_HPU_COMPILE_BACKEND="eager")
    case = cases("tiny-llama")
    # A small bucket set (one sequence, 64 tokens): graphs depend on shapes
    # only, so requests of both adapters and none take the warmed graphs.
    engine = ENGINE | dict(max_model_len=64, max_num_seqs=1, block_size=16)
    with vllm_engine(case.base, enforce_eager=False, **engine) as llm:
        warmed = compiled_graphs()
        assert warmed > 0
        actual = lora_greedy(llm, case)
        assert compiled_graphs() == warmed
    check(case, actual)


def _bad_adapters(case: Case, out_dir: Path) -> dict[Path, tuple[int, str]]:
    """Adapters a server must refuse: folder -> (status, what the answer names).
    vLLM's server answers 404 for a missing folder and 500, with the cause, for
    an adapter it cannot load."""
    good = Path(case.requests[1].lora_path)  # type: ignore[union-attr]
    too_big = build_adapter(
        case.base, AdapterSpec(2 * MAX_LORA_RANK, ATTENTION, 3), out_dir / "big"
    )
    malformed = out_dir / "malformed"
    malformed.mkdir()
    (malformed / "adapter_config.json").write_text("{not json")
    modules = rename_target(good, "q_proj", "qx_proj", out_dir / "modules")
    return {
        too_big: (500, "lora rank 32 is greater than max_lora_rank 16"),
        out_dir / "missing": (404, "no adapter found"),
        malformed: (500, "could not be loaded: expecting property name"),
        modules: (500, "qx_proj"),
    }


def test_server_loads_and_unloads_adapters_at_run_time(cases, tmp_path):
    case = cases("tiny-llama")
    args = [
        *("--served-model-name", "base", "--dtype", "float32", "--seed", "0"),
        *("--enforce-eager", "--max-model-len", "128", "--enable-lora"),
        *("--max-loras", "2", "--max-lora-rank", str(MAX_LORA_RANK)),
    ]
    env = {"VLLM_HPU_EMULATION": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    with vllm_server(case.base, args, env, tmp_path / "server.log") as url:

        def complete(model: str) -> httpx.Response:
            body = {"model": model, "prompt": case.prompts[0], **GREEDY}
            return httpx.post(f"{url}/v1/completions", json=body, timeout=60)

        for path, (status, cause) in _bad_adapters(case, tmp_path).items():
            load = {"lora_name": path.name, "lora_path": str(path)}
            answer = httpx.post(f"{url}/v1/load_lora_adapter", json=load, timeout=60)
            assert answer.status_code == status, answer.text
            assert cause in answer.text.lower(), answer.text
        adapter = {"lora_name": "a1", "lora_path": case.requests[1].lora_path}  # type: ignore[union-attr]
        answer = httpx.post(f"{url}/v1/load_lora_adapter", json=adapter, timeout=60)
        assert answer.status_code == 200, answer.text
        answer = complete("a1")
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["token_ids"] == case.expected[0]
        unload = {"lora_name": "a1"}
        answer = httpx.post(f"{url}/v1/unload_lora_adapter", json=unload, timeout=60)
        assert answer.status_code == 200, answer.text
        assert 400 <= complete("a1").status_code < 500
        assert complete("base").status_code == 200
