"""Sliding windows free their blocks (vLLM's hybrid KV cache manager): with a KV
budget that holds FULL_ONLY_SEQS decoding sequences when every layer keeps every
block, the engine runs as many more at once as the layer mix allows, and still
generates transformers' greedy tokens, through preemption and prefix hits that
reach past the window.

Gemma 2: one windowed (40 tokens) and one global layer, blocks of 16, so a
sequence holds its whole table in the global group and a window's worth in the
windowed one. Mistral: every layer windowed (32 tokens) with blocks of 64, a
window smaller than a block.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from models import model_path
from vllm import SamplingParams
from vllm.v1.kv_cache_interface import SlidingWindowSpec

from e2e.harness import counted, counters, hf_greedy, random_prompts, vllm_engine

pytestmark = pytest.mark.slow

PROMPT_LEN = 200  # five to six windows
MAX_TOKENS = 64
FULL_ONLY_SEQS = 4
NUM_REQUESTS = 12
PROMPT_SEED = 41
FLOAT32_BYTES = 4


@dataclass(frozen=True)
class Case:
    name: str
    block_size: int
    # Finished sequences (264 tokens) held per sequence of full attention:
    # Gemma 2, 2 x 17 pages against 17 + 4 blocks of one page; Mistral, 2 x 5
    # pages against 2 blocks of two pages.
    factor: float
    hf_attention: str | None = None


CASES = [Case("tiny-gemma2", 16, 1.6, "eager"), Case("tiny-mistral-sw", 64, 2.5)]


def _config(name: str) -> dict[str, Any]:
    return json.loads((Path(model_path(name)) / "config.json").read_text())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _full_only_budget(case: Case) -> int:
    """KV bytes that hold FULL_ONLY_SEQS finished sequences, every layer
    keeping every block."""
    config = _config(case.name)
    page = (
        case.block_size
        * config["num_key_value_heads"]
        * config["head_dim"]
        * 2  # keys and values
        * FLOAT32_BYTES
    )
    blocks = _cdiv(PROMPT_LEN + MAX_TOKENS, case.block_size)
    return FULL_ONLY_SEQS * blocks * page * config["num_hidden_layers"]


def _kept_blocks(spec: Any, num_tokens: int) -> int:
    """Blocks one sequence of ``num_tokens`` holds in a group of ``spec``."""
    if isinstance(spec, SlidingWindowSpec):
        return _cdiv(spec.sliding_window - 1, spec.block_size) + 1
    return _cdiv(num_tokens, spec.block_size)


def _mix_factor(groups: Any) -> float:
    """How many times more finished sequences the groups hold than full
    attention in every layer: pages per sequence, all layers full over the
    groups' (each pool block is one page of each layer of the largest group)."""
    length = PROMPT_LEN + MAX_TOKENS
    num_layers = sum(len(g.layer_names) for g in groups)
    pool_block_pages = max(len(g.layer_names) for g in groups)
    full_pages = num_layers * _cdiv(length, groups[0].kv_cache_spec.block_size)
    kept = sum(_kept_blocks(g.kv_cache_spec, length) for g in groups)
    return full_pages / (kept * pool_block_pages)


def _hybrid_seqs(kv_cache_config: Any) -> int:
    """Finished sequences the groups' block pool holds."""
    groups = kv_cache_config.kv_cache_groups
    length = PROMPT_LEN + MAX_TOKENS
    per_seq = sum(_kept_blocks(g.kv_cache_spec, length) for g in groups)
    return kv_cache_config.num_blocks // per_seq


@dataclass
class Observed:
    most_decoding: int = 0  # requests past their prompt in one step
    most_window_blocks: int = 0  # blocks a decoding request held in a window
    computed: dict[str, int] = field(default_factory=dict)  # after the last step
    earlier: dict[str, int] = field(default_factory=dict)  # after the one before


def _observe(scheduler: Any, seen: Observed) -> None:
    decoding = [
        r for r in scheduler.running if r.num_computed_tokens > r.num_prompt_tokens
    ]
    seen.most_decoding = max(seen.most_decoding, len(decoding))
    # Requests that decoded one token in each of the last two steps: the
    # scheduler frees what left a window one step late (on the tokens it knows
    # processed), so a prefill's or a resumed request's blocks go a step later.
    decoded = [
        r
        for r in decoding
        if seen.computed.get(r.request_id) == r.num_computed_tokens - 1
        and seen.earlier.get(r.request_id) == r.num_computed_tokens - 2
    ]
    seen.earlier = seen.computed
    seen.computed = {r.request_id: r.num_computed_tokens for r in scheduler.running}
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    groups = scheduler.kv_cache_config.kv_cache_groups
    for group, manager in zip(groups, managers, strict=True):
        if not isinstance(group.kv_cache_spec, SlidingWindowSpec):
            continue
        for request in decoded:
            blocks = manager.req_to_blocks[request.request_id]
            held = sum(not block.is_null for block in blocks)
            seen.most_window_blocks = max(seen.most_window_blocks, held)


def _run_stepwise(
    llm: Any, prompts: list[list[int]], seen: Observed
) -> list[list[int]]:
    """Greedy outputs in prompt order, observing the scheduler after each step."""
    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    first = engine.get_num_unfinished_requests()
    ids = [f"{first}-{i}" for i in range(len(prompts))]
    for request_id, prompt in zip(ids, prompts, strict=True):
        engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
    outputs: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                outputs[output.request_id] = list(output.outputs[0].token_ids)
        _observe(scheduler, seen)
    return [outputs[request_id] for request_id in ids]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_windows_free_blocks_for_more_sequences(case: Case) -> None:
    vocab_size = _config(case.name)["vocab_size"]
    prompts = random_prompts([PROMPT_LEN] * NUM_REQUESTS, vocab_size, PROMPT_SEED)
    # The last prompt (its blocks freed last, so still cached) with a new tail:
    # a prefix hit that reaches several windows past the first token.
    again = [prompts[-1] + prompts[0][:20]]
    expected = hf_greedy(
        model_path(case.name),
        prompts + again,
        MAX_TOKENS,
        torch.float32,
        case.hf_attention,
    )
    with vllm_engine(
        model_path(case.name),
        block_size=case.block_size,
        max_model_len=512,
        max_num_seqs=NUM_REQUESTS,
        kv_cache_memory_bytes=_full_only_budget(case),
        enable_prefix_caching=True,
    ) as llm:
        scheduler = llm.llm_engine.engine_core.engine_core.scheduler
        before, seen = counters(llm), Observed()
        actual = _run_stepwise(llm, prompts, seen)
        actual += _run_stepwise(llm, again, Observed())
        after = counters(llm)
    for i, (want, got) in enumerate(zip(expected, actual, strict=True)):
        assert got == want, f"{case.name}: prompt {i} diverged"
    groups = scheduler.kv_cache_config.kv_cache_groups
    windows = [g.kv_cache_spec for g in groups if g.kv_cache_spec.sliding_window]
    assert windows, "no windowed KV cache group: every layer keeps every block"
    window = windows[0]
    # Windowed groups hold a window's blocks, so the pool holds more sequences
    # than with every block kept, by the layer mix's factor ...
    assert seen.most_window_blocks == _kept_blocks(window, PROMPT_LEN)
    assert _mix_factor(groups) >= case.factor
    allowed = _hybrid_seqs(scheduler.kv_cache_config)
    assert allowed == int(FULL_ONLY_SEQS * _mix_factor(groups))
    # ... and the engine ran more at once than full attention ever could: a
    # decoding sequence there holds at least its prompt's blocks in each layer.
    least = _cdiv(PROMPT_LEN + 1, case.block_size)
    full_only_most = FULL_ONLY_SEQS * _cdiv(PROMPT_LEN + MAX_TOKENS, case.block_size)
    assert seen.most_decoding > full_only_most // least, seen
    hits = counted(before, after, "vllm:prefix_cache_hits")
    preemptions = counted(before, after, "vllm:num_preemptions")
    assert hits > 0 and preemptions > 0, (hits, preemptions)
