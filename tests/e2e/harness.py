"""Run the same prompts through vLLM on the plugin and through transformers.

vLLM runs in this process (no engine subprocess) so tests stay fast; every engine
is shut down and the distributed state cleaned before the next one starts.

Engine start-ups are most of the suite's time, so tests whose engine needs
nothing fresh share one. Describe the engine with :func:`engine_spec` and ask for
it through the ``llm`` fixture (tests/e2e/conftest.py)::

    SAMPLING = engine_spec("tiny-llama", block_size=16, max_model_len=512)

    @uses_engines(SAMPLING)
    def test_something(llm): ...

Every test with an equal spec (model, ``LLM`` arguments after the defaults of
:func:`vllm_engine`, and plugin variables), in any module, gets the same engine:
pytest runs them one after another (a session-scoped parameter) and
:data:`ENGINE_POOL` keeps one engine alive at a time. Before each test the
prefix cache is emptied; vLLM's metrics keep counting across tests, so compare
counters before and after (:func:`counters`). A test needs :func:`vllm_engine`
(a fresh engine) when it reads start-up logs or warmup compilations, changes
the runner or the engine (``collective_rpc`` patches, LoRA adapters loaded by
a server), sets variables with ``hpu_env`` that its engine must see, or shuts
the engine down. See docs/testing.md.
"""

import contextlib
import dataclasses
import gc
import os
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import pytest
import torch
from config_passes import engine_core_pass

from e2e.references import cached_tokens

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

KV_CACHE_BYTES = 64 << 20  # small, so tests never size a cache from host RAM
# vLLM's default engine, the engine core in a process of its own (as LLM(...)
# and vllm serve run it): a spec's or plugin_env's variables for tests of the
# path a user takes, where the harness's engines otherwise run in-process.
DEFAULT_ENGINE = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
# What a fresh default_engine adds: the callables a test sends to the engine's
# process (apply_model, collective_rpc) travel pickled. Set for the engine's
# whole life: its client and core must agree on it for every message.
SENDS_CALLABLES = {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}


def one_bucket(dimension: str, size: int) -> dict[str, str]:
    """VLLM_<dimension>_BUCKET_{MIN,STEP,MAX} set for buckets of one size: a
    compiled engine warms up only the shapes its test runs."""
    return {f"VLLM_{dimension}_BUCKET_{b}": str(size) for b in ("MIN", "STEP", "MAX")}


def random_prompts(
    lengths: list[int], vocab_size: int, seed: int = 0
) -> list[list[int]]:
    """Token-id prompts of the given lengths, avoiding the special tokens."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab_size) for _ in range(n)] for n in lengths]


def hf_greedy(
    model_dir: str,
    prompts: list[list[int]],
    max_tokens: int,
    dtype: torch.dtype,
    attn_implementation: str | None = None,
    prepare: Callable[[torch.nn.Module], None] | None = None,
) -> list[list[int]]:
    """Greedy continuations by transformers, one sequence at a time (no padding).
    ``attn_implementation="eager"`` where torch's SDPA cannot express the model's
    attention (Gemma 2's soft-capping); ``prepare`` changes the loaded model
    (e.g. hooks that quantize activations as a quantized checkpoint's do).
    Without ``prepare``, kept on disk between runs, keyed by the model's bytes
    and everything else that decides them (e2e/references.py); a ``prepare``
    cannot be keyed by what it does, so its references are computed each time."""
    if prepare is not None:
        return _hf_greedy(
            model_dir, prompts, max_tokens, dtype, attn_implementation, prepare
        )
    return cached_tokens(
        _hf_greedy,
        model_dir,
        prompts=prompts,
        max_tokens=max_tokens,
        dtype=dtype,
        attn_implementation=attn_implementation,
    )


@torch.no_grad()
def _hf_greedy(
    model_dir: str,
    prompts: list[list[int]],
    max_tokens: int,
    dtype: torch.dtype,
    attn_implementation: str | None,
    prepare: Callable[[torch.nn.Module], None] | None = None,
) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=dtype, attn_implementation=attn_implementation
    ).eval()
    if prepare is not None:
        prepare(model)
    outputs = []
    for prompt in prompts:
        input_ids = torch.tensor([prompt])
        generated: list[int] = []
        past = None
        for _ in range(max_tokens):
            result = model(input_ids=input_ids, past_key_values=past, use_cache=True)
            past = result.past_key_values
            token = int(result.logits[0, -1].argmax())
            generated.append(token)
            input_ids = torch.tensor([[token]])
        outputs.append(generated)
    return outputs


def _with_defaults(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    defaults = {
        "dtype": "float32",
        "kv_cache_memory_bytes": KV_CACHE_BYTES,
        "max_model_len": 1024,
        "seed": 0,
        "disable_log_stats": False,
    }
    return defaults | dict(kwargs)


@contextlib.contextmanager
def vllm_engine(model_dir: str, **kwargs: Any) -> Iterator[Any]:
    """A fresh LLM on the plugin in emulation, torn down on exit (a shared
    engine still alive is shut down first: one engine at a time)."""
    ENGINE_POOL.release()
    with _engine(model_dir, _with_defaults(kwargs)) as llm:
        yield llm


@contextlib.contextmanager
def default_engine(model_dir: str, **kwargs: Any) -> Iterator[Any]:
    """A fresh engine as :func:`vllm_engine` starts it, but through vLLM's
    default path: its core in a process of its own (DEFAULT_ENGINE, read as the
    engine starts and set only then: a module's engine would otherwise put
    the module's other engines in processes of their own), taking the test's
    callables (SENDS_CALLABLES, for the engine's whole life)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(plugin_env(SENDS_CALLABLES.items()))
        with plugin_env(DEFAULT_ENGINE.items()):
            llm = stack.enter_context(vllm_engine(model_dir, **kwargs))
        assert core_in_own_process(llm)
        yield llm


@contextlib.contextmanager
def _engine(model_dir: str, kwargs: dict[str, Any]) -> Iterator[Any]:
    from vllm import LLM
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    # Dynamo's code cache outlives an engine in this process: without a reset an
    # engine would replay graphs an earlier test's engine compiled, and a test
    # counting compilations would depend on what ran before it on its worker.
    torch._dynamo.reset()
    with _heap_frozen():
        with _engine_core_pass_checked():
            llm = LLM(model=model_dir, **kwargs)
        try:
            yield llm
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm
            cleanup_dist_env_and_memory()  # collects the engine's garbage


@contextlib.contextmanager
def _engine_core_pass_checked() -> Iterator[None]:
    """The pass vLLM's default engine core runs over the config it is sent, run
    on a copy of the config this engine is built from: an in-process engine
    never runs it, and a config it would change or refuse fails the test
    (tests/config_passes.py)."""
    from vllm.engine.arg_utils import EngineArgs

    create = EngineArgs.create_engine_config

    def checked(self: EngineArgs, *args: Any, **kwargs: Any) -> Any:
        config = create(self, *args, **kwargs)
        changed = engine_core_pass(config)
        assert not changed, f"the engine core's pass would change {changed}"
        return config

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EngineArgs, "create_engine_config", checked)
        yield


@contextlib.contextmanager
def _heap_frozen() -> Iterator[None]:
    """This process's objects so far (torch, vLLM, transformers: ~800k) kept out
    of the garbage collector's walks while an engine lives and is torn down.

    vLLM collects garbage five times while an engine starts and twice while it
    stops; a full collection over the whole heap takes a second on a busy
    core. Frozen, the heap is skipped and each collection walks only what came
    since (the engine's own objects, collected at its shutdown). vLLM's own
    freeze at start-up and unfreeze at shutdown would undo that, and are left
    out meanwhile: without its freeze the engine's objects stay collectable."""
    gc.collect()  # garbage left since the last engine, never to be frozen
    gc.freeze()
    freeze, unfreeze = gc.freeze, gc.unfreeze
    gc.freeze = gc.unfreeze = lambda: None  # type: ignore[assignment]
    try:
        yield
    finally:
        gc.freeze, gc.unfreeze = freeze, unfreeze  # type: ignore[assignment]


def vllm_greedy(llm: Any, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    results = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return [list(r.outputs[0].token_ids) for r in results]


def core_in_own_process(llm: Any) -> bool:
    """Whether the engine runs as vLLM's default does: its core in a process
    of its own (DEFAULT_ENGINE), not in this one."""
    from vllm.v1.engine.core_client import MPClient

    return isinstance(llm.llm_engine.engine_core, MPClient)


def vllm_greedy_with_images(
    llm: Any,
    requests: Sequence[tuple[str, Sequence[int]]],
    image: Callable[[int], Any],
    max_tokens: int,
) -> list[list[int]]:
    """One ``generate`` call (all requests are scheduled together) of prompts
    with the images ``image(seed)`` of their seeds (none: text only)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    prompts = [
        {"prompt": p, "multi_modal_data": {"image": [image(s) for s in seeds]}}
        if seeds
        else {"prompt": p}
        for p, seeds in requests
    ]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def counters(llm: Any) -> dict[str, float]:
    """vLLM's counters so far, by name (a shared engine's count since it started)."""
    return {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}


def counted(
    before: Mapping[str, float], after: Mapping[str, float], name: str
) -> float:
    """How much counter ``name`` grew between two :func:`counters` readings."""
    return after.get(name, 0.0) - before.get(name, 0.0)


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process so far (dynamo's own
    counter; engines in this process compile here)."""
    from torch._dynamo.utils import counters as dynamo_counters

    return int(dynamo_counters["stats"]["unique_graphs"])


def _worker_compiled_graphs(worker: object) -> int:
    return compiled_graphs()


def workers_compiled_graphs(llm: Any) -> list[int]:
    """:func:`compiled_graphs` in each of ``llm``'s workers, wherever they run
    (a default engine's need SENDS_CALLABLES)."""
    return llm.collective_rpc(_worker_compiled_graphs)


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """What a shared engine is keyed by: equal specs share one engine."""

    model: str  # a name under .cache/models, or a path
    # (name, repr(value)) of the LLM arguments and plugin variables, sorted:
    # hashable, so pytest groups the tests of one spec across modules.
    options: tuple[tuple[str, str], ...]
    env: tuple[tuple[str, str], ...]
    name: str = dataclasses.field(compare=False)
    kwargs: Mapping[str, Any] = dataclasses.field(compare=False, repr=False)


def engine_spec(
    model: str, *, name: str = "", env: Mapping[str, str] | None = None, **kwargs: Any
) -> EngineSpec:
    """The engine ``vllm_engine(model_path(model), **kwargs)`` would start, with
    plugin variables ``env`` set while it starts and while a test uses it;
    ``name`` labels test ids only (default: the model)."""
    kwargs = _with_defaults(kwargs)
    options = tuple(sorted((k, repr(v)) for k, v in kwargs.items()))
    env_items = tuple(sorted((env or {}).items()))
    label = name or os.path.basename(model)
    return EngineSpec(model, options, env_items, label, kwargs)


def uses_engines(*specs: EngineSpec) -> pytest.MarkDecorator:
    """Runs the test once per spec, its ``llm`` fixture the spec's shared engine."""
    return pytest.mark.parametrize(
        "shared_engine", specs, indirect=True, ids=[s.name for s in specs]
    )


@contextlib.contextmanager
def plugin_env(values: Iterable[tuple[str, str]]) -> Iterator[None]:
    """Plugin (and vLLM) variables set inside the block, the plugin's and
    vLLM's cached readings dropped on entry and exit (an engine's start turns
    vLLM's cache on)."""
    import vllm.envs

    from vllm_hpu import envs

    patch = pytest.MonkeyPatch()
    for name, value in values:
        patch.setenv(name, value)
    envs.get_envs.cache_clear()
    vllm.envs.disable_envs_cache()
    try:
        yield
    finally:
        patch.undo()
        envs.get_envs.cache_clear()
        vllm.envs.disable_envs_cache()


class SharedPool:
    """At most one shared engine (or server) alive: asking for another spec
    shuts the current one down; so does a fresh :func:`vllm_engine`, and the
    end of the last test using a spec (tests/e2e/conftest.py)."""

    def __init__(self, start: Callable[[Any], AbstractContextManager[Any]]) -> None:
        self._start = start
        self._spec: Any = None
        self._stack = contextlib.ExitStack()
        self._value: Any = None

    def get(self, spec: Any) -> Any:
        if spec != self._spec:
            self.release()
            self._value = self._stack.enter_context(self._start(spec))
            self._spec = spec
        return self._value

    def release(self) -> None:
        self._spec, self._value = None, None
        self._stack.close()


@contextlib.contextmanager
def _start_shared(spec: EngineSpec) -> Iterator[Any]:
    from models import model_path

    path = spec.model if os.path.isabs(spec.model) else model_path(spec.model)
    with contextlib.ExitStack() as stack:
        with plugin_env(spec.env):  # while it starts; the llm fixture sets them again
            llm = stack.enter_context(_engine(path, dict(spec.kwargs)))
        yield llm


ENGINE_POOL = SharedPool(_start_shared)
