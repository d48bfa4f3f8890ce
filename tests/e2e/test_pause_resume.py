"""pause_generation / resume_generation with requests in flight (issue 36).

RL frameworks pause vLLM's AsyncLLM between rollouts to push new weights. One
AsyncLLM on the plugin, requests mid-generation at each pause:
- keep: frozen with their KV blocks, then resumed to the unpaused run's tokens,
  also when one of them is aborted meanwhile (the engine then steps once with
  nothing scheduled and the runner must keep the others' states); with
  clear_cache vLLM preempts them and the runner recomputes them on resume;
  sleep(mode="keep") and release_kv_cache_memory() keep them across the
  KV cache's release and return.
- wait: they finish; a request arriving meanwhile waits for resume.
- abort: they end "abort" with the unpaused run's first tokens and their KV
  blocks are freed; weights reloaded while paused (the prefix cache cleared)
  give the new weights' tokens (transformers') to requests sent before resume.
"""

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from models import model_path

from e2e.harness import ENGINE_POOL, engine_spec, hf_greedy, random_prompts

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
# Tokens per request: the pause must catch every request between PAUSE_AT and
# its last token while the engine core's process steps on its own (a few ms a
# step), with this process polling on a loaded machine (16 was passed before
# it polled, at load 12).
MAX_TOKENS = 128
PAUSE_AT = 4  # tokens each request has made when paused
# The 21-token prompt fills a block: a cache kept across the weight update
# would serve its old KV.
PROMPTS = random_prompts([5, 21, 3], 1024, seed=3)
# The harness's defaults; sleep mode keeps vLLM's weight layout for reloads.
ENGINE = engine_spec(MODEL, block_size=16, enable_sleep_mode=True)
QUIET_S = 0.3  # how long a paused request must stay silent
TIMEOUT_S = 60.0

Tokens = list[list[int]]


class Batch:
    """Requests streaming their tokens, as a rollout sends them."""

    def __init__(self, engine: Any, tag: str, prompts: Tokens) -> None:
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        self.request_ids = [f"{tag}-{i}" for i in range(len(prompts))]
        self.num_tokens = dict.fromkeys(self.request_ids, 0)
        self._tasks = [
            asyncio.create_task(self._generate(engine, request_id, prompt, params))
            for request_id, prompt in zip(self.request_ids, prompts, strict=True)
        ]

    async def _generate(
        self, engine: Any, request_id: str, prompt: list[int], params: Any
    ) -> Any:
        output = None
        stream = engine.generate({"prompt_token_ids": prompt}, params, request_id)
        async for output in stream:
            self.num_tokens[request_id] = len(output.outputs[0].token_ids)
        return output.outputs[0]

    async def reach(self, num_tokens: int) -> None:
        """Until every request has ``num_tokens`` tokens (and none finished)."""
        await _until(lambda: min(self.num_tokens.values()) >= num_tokens)
        assert max(self.num_tokens.values()) < MAX_TOKENS, "no longer in flight"

    async def assert_frozen(self) -> None:
        """No request makes a token for a while."""
        before = dict(self.num_tokens)
        await asyncio.sleep(QUIET_S)
        assert self.num_tokens == before

    async def results(self) -> tuple[Tokens, list[str]]:
        outputs = await asyncio.wait_for(asyncio.gather(*self._tasks), TIMEOUT_S)
        return [list(o.token_ids) for o in outputs], [o.finish_reason for o in outputs]


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        while not condition():
            await asyncio.sleep(0.002)


def _metric(name: str) -> float:
    from vllm.v1.metrics.reader import get_metrics_snapshot

    return sum(m.value for m in get_metrics_snapshot() if m.name == name)


async def _unpaused(engine: Any) -> Tokens:
    tokens, reasons = await Batch(engine, "unpaused", PROMPTS).results()
    assert reasons == ["length"] * len(PROMPTS)
    return tokens


async def _keep(engine: Any, reference: Tokens) -> None:
    """Frozen with their KV; the first is aborted while paused; the others
    resume to the unpaused run's tokens."""
    batch = Batch(engine, "keep", PROMPTS)
    await batch.reach(PAUSE_AT)
    await engine.pause_generation(mode="keep", clear_cache=False)
    assert await engine.is_paused()
    await batch.assert_frozen()
    await engine.abort(batch.request_ids[0])
    await batch.assert_frozen()  # the engine steps with nothing scheduled
    await engine.resume_generation()
    assert not await engine.is_paused()
    tokens, reasons = await batch.results()
    assert reasons == ["abort", "length", "length"]
    assert tokens[0] == reference[0][: len(tokens[0])]
    assert tokens[1:] == reference[1:]


async def _keep_clearing_cache(engine: Any, reference: Tokens) -> None:
    """clear_cache drops their KV (vLLM preempts them to empty the prefix
    cache): on resume the runner takes them back and recomputes them."""
    batch = Batch(engine, "keep-cleared", PROMPTS)
    await batch.reach(PAUSE_AT)
    await engine.pause_generation(mode="keep", clear_cache=True)
    await batch.assert_frozen()
    await engine.resume_generation()
    assert await batch.results() == (reference, ["length"] * len(PROMPTS))


async def _sleep_keeping(engine: Any, reference: Tokens) -> None:
    """sleep(mode="keep") frees the device with requests frozen in the queue;
    they restart on wake-up."""
    batch = Batch(engine, "asleep", PROMPTS)
    await batch.reach(PAUSE_AT)
    await engine.sleep(level=1, mode="keep")
    assert await engine.is_sleeping()
    await batch.assert_frozen()
    await engine.wake_up()
    assert await batch.results() == (reference, ["length"] * len(PROMPTS))


async def _release_kv_keeping(engine: Any, reference: Tokens) -> None:
    """The KV cache's memory released under a keep pause: the frozen requests
    recompute once it is back."""
    batch = Batch(engine, "released", PROMPTS)
    await batch.reach(PAUSE_AT)
    await engine.pause_generation(mode="keep", clear_cache=False)
    await engine.release_kv_cache_memory()
    await batch.assert_frozen()
    assert await engine.wake_up(tags=["kv_cache"])  # fully awake: resumes
    assert await batch.results() == (reference, ["length"] * len(PROMPTS))


async def _wait(engine: Any, reference: Tokens) -> None:
    """In-flight requests finish before the pause returns; one sent during
    the pause gets no token until resume."""
    batch = Batch(engine, "wait", PROMPTS)
    await batch.reach(PAUSE_AT)
    pausing = asyncio.create_task(engine.pause_generation(mode="wait"))
    while not await engine.is_paused():
        await asyncio.sleep(0.002)
    late = Batch(engine, "late", PROMPTS[:1])
    await asyncio.wait_for(pausing, TIMEOUT_S)
    assert await batch.results() == (reference, ["length"] * len(PROMPTS))
    await late.assert_frozen()
    assert late.num_tokens == {"late-0": 0}
    await engine.resume_generation()
    assert await late.results() == (reference[:1], ["length"])


async def _abort_and_reload(engine: Any, reference: Tokens, weights: str) -> Tokens:
    """Aborted with their tokens so far, their KV blocks freed; weights
    reloaded while paused serve the requests sent before resume."""
    batch = Batch(engine, "abort", PROMPTS)
    await batch.reach(PAUSE_AT)
    assert _metric("vllm:kv_cache_usage_perc") > 0
    await engine.pause_generation(mode="abort")
    tokens, reasons = await batch.results()
    assert reasons == ["abort"] * len(PROMPTS)
    for made, expected in zip(tokens, reference, strict=True):
        assert PAUSE_AT <= len(made) < MAX_TOKENS and made == expected[: len(made)]
    await _until(lambda: _metric("vllm:kv_cache_usage_perc") == 0)
    await engine.collective_rpc("reload_weights", kwargs={"weights_path": weights})
    after = Batch(engine, "reloaded", PROMPTS)
    await after.assert_frozen()
    await engine.resume_generation()
    tokens, reasons = await after.results()
    assert reasons == ["length"] * len(PROMPTS)
    return tokens


def _changed_weights(directory: Path) -> str:
    """tiny-llama with seeded noise on its matrices: other greedy tokens."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_path(MODEL), directory)
    weights = load_file(directory / "model.safetensors")
    generator = torch.Generator().manual_seed(0)
    for name, weight in weights.items():
        if weight.dim() == 2:
            noise = torch.randn(weight.shape, generator=generator)
            weights[name] = weight + 0.5 * weight.std() * noise
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    return str(directory)


@contextlib.asynccontextmanager
async def _async_llm() -> AsyncIterator[Any]:
    """An AsyncLLM on the spec's engine (its core in a process of its own)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    ENGINE_POOL.release()  # one engine at a time
    args = AsyncEngineArgs(model=model_path(ENGINE.model), **ENGINE.kwargs)
    engine = AsyncLLM.from_engine_args(args)
    try:
        yield engine
    finally:
        engine.shutdown()


def test_pause_modes_with_requests_in_flight(tmp_path: Path) -> None:
    weights = _changed_weights(tmp_path / "changed")

    async def scenario() -> Tokens:
        async with _async_llm() as engine:
            reference = await _unpaused(engine)
            assert reference == hf_greedy(
                model_path(MODEL), PROMPTS, MAX_TOKENS, torch.float32
            )
            await _keep(engine, reference)
            await _keep_clearing_cache(engine, reference)
            await _sleep_keeping(engine, reference)
            await _release_kv_keeping(engine, reference)
            await _wait(engine, reference)
            return await _abort_and_reload(engine, reference, weights)

    reloaded = asyncio.run(scenario())
    assert reloaded == hf_greedy(weights, PROMPTS, MAX_TOKENS, torch.float32)
    assert reloaded != hf_greedy(model_path(MODEL), PROMPTS, MAX_TOKENS, torch.float32)
