"""Long context end to end: tiny float32 models served at max_model_len 131072
(Llama with llama3 rope scaling, Qwen2 with YaRN, Phi-3 with LongRoPE), a long
prompt whole and chunked, then 16 greedy tokens equal to transformers'.

One engine per family serves every check, in three calls:
1. the long prompt alone: one prompt pass over all of it (attention cut into
   tiles, VLLM_HPU_FSDPA_SLICE_*);
2. three short prompts, then the long prompt again (not reading the prefix
   cache): the shorts take part of the step's token budget, so the long prompt
   is chunked, its first chunk packed with the shorts into one merged pass (a
   block-diagonal mask over one long and several short prompts), its second
   chunk attending the first as cached context;
3. three prompts extending the long prompt: a prefix-cache hit on all its whole
   blocks, then the three long sequences decode in one batch.
The step trace (VLLM_HPU_BUCKET_TRACE) shows each of these shapes happened.

Lengths: each family's long prompt has 24,000 tokens, past its original
context (16,384 positions for the Llama and the Qwen2, 4,096 for the Phi-3),
so the scaled rope and the tiles (8192 keys and more) are what runs; the
rope of each family is checked at every position up to 131,071 against
transformers in tests/unit/test_rope_long_positions.py. Each family also
runs with a prompt of 100,000 tokens (782 blocks per sequence in the decode
batch) under the marker ``long_context``, left out of the default run: 5 to 11
minutes per family on 2 loaded cores, 100k tokens of attention in transformers
and twice in the plugin (``pytest -m long_context tests/e2e/test_long_context.py``).

transformers computes the reference once per family: one prefill of the long
prompt, whose cache serves its own continuation and the three extensions
(cropped back after each), and the short prompts. The short prompts are longer
than Phi-3's original 4096 positions: vLLM applies LongRoPE's long factors to
every sequence once max_model_len exceeds that, transformers only to longer
sequences, so a shorter prompt would differ by design, not by the plugin.
"""

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from models import model_path

from e2e.harness import random_prompts, vllm_engine
from vllm_hpu.bucketing.trace import PromptChunk, StepShape, StepTrace

pytestmark = pytest.mark.slow

MAX_MODEL_LEN = 131072
SHORTS = (4200, 4500, 4800)
SUFFIXES = (300, 200, 400)
MAX_TOKENS = 16
BLOCK_SIZE = 128
# 1280 blocks at 512 bytes per token: the 1024 blocks of max_model_len (vLLM
# asks for one whole sequence), the dummy block, and room for the shorts.
KV_CACHE_BYTES = 80 << 20
VOCAB = 1024


@dataclasses.dataclass(frozen=True)
class Family:
    model: str
    long: int  # tokens of the long prompt

    @property
    def budget(self) -> int:
        """max_num_batched_tokens: the long prompt whole, not with the shorts."""
        return self.long + 2400

    def __str__(self) -> str:
        return f"{self.model}-{self.long // 1000}k"


FAMILIES = (
    Family("tiny-llama3-128k", 24_000),
    Family("tiny-qwen2-yarn-128k", 24_000),
    Family("tiny-phi3-longrope-128k", 24_000),
    *(
        pytest.param(Family(model, 100_000), marks=pytest.mark.long_context)
        for model in (
            "tiny-llama3-128k",
            "tiny-qwen2-yarn-128k",
            "tiny-phi3-longrope-128k",
        )
    ),
)


@dataclasses.dataclass
class Prompts:
    long: list[int]
    shorts: list[list[int]]
    suffixes: list[list[int]]

    @classmethod
    def make(cls, long: int) -> "Prompts":
        long_prompt, *rest = random_prompts([long, *SHORTS, *SUFFIXES], VOCAB, 38)
        return cls(long_prompt, rest[: len(SHORTS)], rest[len(SHORTS) :])


@dataclasses.dataclass
class FamilyRun:
    """What transformers and the plugin produced for one family."""

    family: Family
    expected: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    got: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    cached_tokens: dict[str, int] = dataclasses.field(default_factory=dict)
    steps: tuple[StepShape, ...] = ()
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)


@torch.no_grad()
def _greedy_from(model: Any, past: Any, input_ids: list[int], length: int) -> list[int]:
    """Greedy tokens after feeding ``input_ids`` on top of ``past``; the cache
    is cropped back to ``length`` tokens afterwards, for the next extension."""
    tokens: list[int] = []
    feed = input_ids
    for _ in range(MAX_TOKENS):
        out = model(
            input_ids=torch.tensor([feed]), past_key_values=past, use_cache=True
        )
        tokens.append(int(out.logits[0, -1].argmax()))
        feed = tokens[-1:]
    past.crop(length)
    return tokens


@torch.no_grad()
def _transformers_reference(model_dir: str, prompts: Prompts) -> dict[str, list[int]]:
    from transformers import AutoModelForCausalLM, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    past = DynamicCache(config=model.config)
    out = model(
        input_ids=torch.tensor([prompts.long[:-1]]),
        past_key_values=past,
        use_cache=True,
        logits_to_keep=1,
    )
    del out
    cached = len(prompts.long) - 1
    expected = {"long": _greedy_from(model, past, prompts.long[-1:], cached)}
    for i, suffix in enumerate(prompts.suffixes):
        expected[f"suffix{i}"] = _greedy_from(
            model, past, [prompts.long[-1], *suffix], cached
        )
    for i, short in enumerate(prompts.shorts):
        expected[f"short{i}"] = _greedy_from(model, DynamicCache(), short, 0)
    return expected


def _generate(llm: Any, prompts: list[list[int]], skip_cache: list[bool]) -> list[Any]:
    from vllm import SamplingParams

    params = [
        SamplingParams(
            temperature=0.0,
            max_tokens=MAX_TOKENS,
            ignore_eos=True,
            skip_reading_prefix_cache=skip,
        )
        for skip in skip_cache
    ]
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params)


def _serve(llm: Any, prompts: Prompts, run: FamilyRun) -> None:
    """The three calls of the module docstring, timed."""
    started = time.perf_counter()
    (whole,) = _generate(llm, [prompts.long], [False])
    run.got["long-whole"] = list(whole.outputs[0].token_ids)
    run.seconds["whole"] = time.perf_counter() - started

    started = time.perf_counter()
    outputs = _generate(llm, [*prompts.shorts, prompts.long], [False] * 3 + [True])
    for i, output in enumerate(outputs[:-1]):
        run.got[f"short{i}"] = list(output.outputs[0].token_ids)
    run.got["long-chunked"] = list(outputs[-1].outputs[0].token_ids)
    run.cached_tokens["long-chunked"] = outputs[-1].num_cached_tokens or 0
    run.seconds["chunked"] = time.perf_counter() - started

    started = time.perf_counter()
    extended = [prompts.long + suffix for suffix in prompts.suffixes]
    for i, output in enumerate(_generate(llm, extended, [False] * 3)):
        run.got[f"suffix{i}"] = list(output.outputs[0].token_ids)
        run.cached_tokens[f"suffix{i}"] = output.num_cached_tokens or 0
    run.seconds["prefix"] = time.perf_counter() - started


@pytest.fixture(scope="module", params=FAMILIES, ids=str)
def family_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FamilyRun]:
    from vllm_hpu import envs

    family: Family = request.param
    model_dir, prompts = model_path(family.model), Prompts.make(family.long)
    run = FamilyRun(family)
    started = time.perf_counter()
    run.expected = _transformers_reference(model_dir, prompts)
    run.seconds["transformers"] = time.perf_counter() - started
    trace_path = tmp_path_factory.mktemp("trace") / "steps.jsonl"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_HPU_BUCKET_TRACE", str(trace_path))
        envs.get_envs.cache_clear()
        engine = dict(
            max_model_len=MAX_MODEL_LEN,
            max_num_batched_tokens=family.budget,
            max_num_seqs=len(SHORTS) + 1,
            enable_prefix_caching=True,
            kv_cache_memory_bytes=KV_CACHE_BYTES,
            block_size=BLOCK_SIZE,
        )
        with vllm_engine(model_dir, **engine) as llm:
            _serve(llm, prompts, run)
    envs.get_envs.cache_clear()
    run.steps = StepTrace.load(trace_path).steps
    print(f"\n{family} seconds: {run.seconds}")
    yield run


def test_long_prompt_whole_equals_transformers(family_run: FamilyRun) -> None:
    assert family_run.got["long-whole"] == family_run.expected["long"]
    # One prompt pass over the whole long prompt.
    whole = PromptChunk(family_run.family.long, 0)
    assert StepShape(prompts=(whole,)) in family_run.steps


def test_long_prompt_chunked_in_a_merged_pass_equals_transformers(
    family_run: FamilyRun,
) -> None:
    run, long = family_run, family_run.family.long
    assert run.got["long-chunked"] == run.expected["long"]
    for i in range(len(SHORTS)):
        assert run.got[f"short{i}"] == run.expected[f"short{i}"], f"short {i}"
    assert run.cached_tokens["long-chunked"] == 0  # computed again, not read
    # The shorts and the long prompt's first chunk in one step (one merged
    # pass), its second chunk over the first as context in the next.
    first_chunk = run.family.budget - sum(SHORTS)
    packed = tuple(PromptChunk(n, 0) for n in (*SHORTS, first_chunk))
    assert any(sorted(step.prompts) == sorted(packed) for step in run.steps)
    rest = PromptChunk(long - first_chunk, first_chunk)
    assert any(rest in step.prompts for step in run.steps)


def test_prefix_hit_then_long_sequences_decode_in_one_batch(
    family_run: FamilyRun,
) -> None:
    run, long = family_run, family_run.family.long
    cached = long // BLOCK_SIZE * BLOCK_SIZE
    for i in range(len(SUFFIXES)):
        assert run.got[f"suffix{i}"] == run.expected[f"suffix{i}"], f"suffix {i}"
        assert run.cached_tokens[f"suffix{i}"] == cached
    # The three extensions decode together, each over all the long prompt's
    # blocks and more (782 each for the Llama's).
    long_batches = [
        step.decode_blocks
        for step in run.steps
        if len(step.decode_blocks) == len(SUFFIXES)
        and min(step.decode_blocks) > long // BLOCK_SIZE
    ]
    assert len(long_batches) >= MAX_TOKENS - 2
