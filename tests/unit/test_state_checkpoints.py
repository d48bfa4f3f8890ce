"""Prefix caching of a hybrid model's states (vLLM's Mamba cache mode "align",
worker/capabilities/state_checkpoints.py): which rows save their slot into
which block, which new requests restore theirs from a prefix hit's block, the
copies through ``HpuStateCache`` around a pass, and the memory they take."""

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import torch
from test_state_cache import CPU, FULL, STATE, _StateLayer, _step
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

from vllm_hpu.attention.metadata import SeqLayout
from vllm_hpu.worker.capabilities.state_cache import HpuStateCache
from vllm_hpu.worker.capabilities.state_checkpoints import (
    StateCheckpoints,
    kv_cache_share,
)
from vllm_hpu.worker.passes.seqs import ScheduledSeq

BS = 16
NUM_BLOCKS = 12
ALIGNED = replace(STATE, block_size=BS)  # "align": a state block per KV block
# Granite-4.0-H's groups: states (m0), attention (a1), states (m2).
CONFIG = KVCacheConfig(
    num_blocks=NUM_BLOCKS,
    kv_cache_tensors=[],
    kv_cache_groups=[
        KVCacheGroupSpec(["m0"], ALIGNED),
        KVCacheGroupSpec(["a1"], FULL),
        KVCacheGroupSpec(["m2"], ALIGNED),
    ],
)


def _seq(row: int, start: int, scheduled: int, blocks: list[int]) -> ScheduledSeq:
    """A row whose state groups 0 and 2 have tables ``blocks`` and ``blocks``
    shifted by 6 (other ids per group, as vLLM's shared pool gives)."""
    other = [(b + 6) % NUM_BLOCKS for b in blocks]
    tables = (blocks, [0] * len(blocks), other)
    return ScheduledSeq(row, SeqLayout(blocks, start, scheduled), tables)


def test_rows_on_a_block_boundary_save_and_new_requests_restore() -> None:
    checkpoints = StateCheckpoints({"m0": 0, "m2": 2}, {"m0": 8, "m2": 8}, 12, BS, CPU)
    hit = _seq(0, 32, 16, [0, 3, 4])  # new at a 32-token hit, ends at 48
    running = _seq(1, 17, 1, [0, 5])  # a decode inside a block: nothing
    filling = _seq(2, 47, 1, [0, 1, 2])  # a decode that fills its third block
    first = _seq(3, 0, 32, [0, 5])  # a new request's first 32 tokens
    copies = checkpoints.plan(
        [(7, hit, True), (6, running, False), (5, filling, False), (4, first, True)]
    )
    assert copies is not None and copies.restores is not None
    assert copies.restores.slots.tolist() == [7]  # from its last hit block
    assert {g: b.tolist() for g, b in copies.restores.blocks.items()} == {
        0: [3],
        2: [9],
    }
    assert copies.saves is not None
    assert copies.saves.slots.tolist() == [7, 5, 4]
    assert copies.saves.blocks[0].tolist() == [4, 2, 5]
    assert copies.saves.blocks[2].tolist() == [10, 8, 11]
    assert checkpoints.plan([(6, running, False)]) is None


def _cache() -> tuple[HpuStateCache, Any]:
    batch = SimpleNamespace(req_ids=[])
    layers = {"m0": _StateLayer(), "m2": _StateLayer()}
    specs = dict.fromkeys(layers, ALIGNED)
    cache = HpuStateCache(layers, specs, batch, 4, CPU, prefix_caching=True)
    cache.allocate(CONFIG)
    return cache, batch


def _pass(seqs: list[ScheduledSeq]) -> Any:
    return SimpleNamespace(
        is_prompt=True,
        seqs=seqs,
        bucket=SimpleNamespace(batch_size=len(seqs) + 1),
        first_token_indices=[32 * row for row in range(len(seqs))],
        state_metadata=None,
        state_checkpoints=None,
    )


def _ssm(cache: HpuStateCache, layer: str) -> torch.Tensor:
    return cache.layers[layer].kv_cache[1]


def test_a_prefix_hit_resumes_from_the_state_saved_at_its_boundary() -> None:
    cache, batch = _cache()
    batch.req_ids = ["a"]
    cache.after_update()
    first = _pass([_seq(0, 0, 32, [0, 3])])
    cache.add_metadata([first])
    cache.before_pass(first)
    for value, layer in enumerate(("m0", "m2"), start=1):  # the pass's states
        _ssm(cache, layer)[cache.slots["a"]].fill_(float(value))
    cache.after_pass(first)
    cache.before_update(_step(finished={"a"}))
    batch.req_ids = ["b", "c"]
    cache.after_update()
    _ssm(cache, "m0")[cache.slots["b"]].fill_(-1.0)  # a previous owner's state
    hit = _pass([_seq(0, 32, 5, [0, 3, 7]), _seq(1, 0, 7, [0, 2])])
    cache.add_metadata([hit])
    cache.before_pass(hit)
    slot_b, slot_c = cache.slots["b"], cache.slots["c"]
    assert torch.all(_ssm(cache, "m0")[slot_b] == 1.0)
    assert torch.all(_ssm(cache, "m2")[slot_b] == 2.0)
    assert _ssm(cache, "m0")[slot_c].abs().sum() == 0  # no hit: untouched
    assert _ssm(cache, "m0")[cache.slots.dummy_slot].abs().sum() == 0
    assert hit.state_metadata.has_initial_state.tolist() == [True, False, False]


def test_without_prefix_caching_passes_copy_nothing() -> None:
    batch = SimpleNamespace(req_ids=["a"])
    layers = {"m0": _StateLayer(), "m2": _StateLayer()}
    cache = HpuStateCache(layers, dict.fromkeys(layers, ALIGNED), batch, 4, CPU)
    cache.allocate(CONFIG)
    cache.after_update()
    forward_pass = _pass([_seq(0, 16, 16, [0, 3])])
    cache.add_metadata([forward_pass])
    assert cache.checkpoints is None and forward_pass.state_checkpoints is None


def test_blocks_and_checkpoints_fit_the_budget() -> None:
    """vLLM sizes blocks from the share at >= one page per block (here
    ``groups`` pages); each block's checkpoints come on top."""
    page, checkpoint, available = 5 * 1024, 3 * 4800, 10 << 20
    share = kv_cache_share(available, page, checkpoint)
    for groups in (1, 2, 4):
        num_blocks = share // (groups * page)
        assert num_blocks * (groups * page + checkpoint) <= available
    assert share // page * (page + checkpoint) > available - page - checkpoint


def test_worker_leaves_slots_and_checkpoints_out_of_the_kv_cache_budget() -> None:
    from vllm_hpu.worker.hpu_worker import HpuWorker

    cache, _ = _cache()
    worker = HpuWorker.__new__(HpuWorker)
    worker.cache_config = SimpleNamespace(kv_cache_memory_bytes=1 << 20)
    worker.model_runner = SimpleNamespace(kv_cache_share=cache.kv_cache_share)
    pages = [ALIGNED.real_page_size_bytes] * 2
    want = kv_cache_share((1 << 20) - cache.num_bytes, pages[0], sum(pages))
    assert worker.determine_available_memory() == want
