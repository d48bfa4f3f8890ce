"""A hybrid model's state cache (worker/capabilities/state_cache.py): slots keyed
by request id with a dummy slot, bound through vLLM's own ``MambaBase`` views;
and the KV cache helpers (worker/kv_caches.py) passing state groups by."""

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)

from vllm_hpu.attention.metadata import SeqLayout
from vllm_hpu.worker.capabilities.state_cache import HpuStateCache, StateSlots
from vllm_hpu.worker.kv_caches import (
    bind_kv_caches,
    group_cache_geometry,
    kv_cache_specs,
    layer_groups,
    reachable_decode_blocks,
)
from vllm_hpu.worker.passes.seqs import ScheduledSeq

CONV, SSM = (3, 144), (8, 16, 8)  # tiny-granite-4.0-h's state shapes
STATE = MambaSpec(
    block_size=256, shapes=(CONV, SSM), dtypes=(torch.float32, torch.float32)
)
FULL = FullAttentionSpec(
    block_size=16, num_kv_heads=4, head_size=16, dtype=torch.float32
)
CPU = torch.device("cpu")


class _StateLayer(MambaBase):
    """vLLM's MambaBase with the two states of a Mamba2 layer."""

    def get_state_shape(self) -> tuple[tuple[int, ...], ...]:
        return (CONV, SSM)

    def get_state_dtype(self) -> tuple[torch.dtype, ...]:
        return (torch.float32, torch.float32)

    @property
    def mamba_type(self) -> Any:
        return "mamba2"

    def get_kv_cache_spec(self, vllm_config: Any) -> MambaSpec:
        return STATE


class _AttentionLayer:
    impl = SimpleNamespace(sliding_window=None)
    kv_cache: Any = None

    def get_kv_cache_spec(self, vllm_config: Any) -> FullAttentionSpec:
        return FULL

    def bind_kv_cache(self, kv_cache: Any) -> None:
        self.kv_cache = kv_cache


def _state_cache(
    max_num_seqs: int = 2, num_speculative_tokens: int = 0
) -> tuple[HpuStateCache, Any]:
    batch = SimpleNamespace(req_ids=[])
    layers = {"m0": _StateLayer(), "m2": _StateLayer()}
    specs = dict.fromkeys(layers, STATE)
    cache = HpuStateCache(
        layers,
        specs,
        batch,
        max_num_seqs,
        CPU,
        num_speculative_tokens=num_speculative_tokens,
    )
    return cache, batch


def _step(finished=(), preempted=None, resumed=()) -> Any:
    return SimpleNamespace(
        finished_req_ids=set(finished),
        preempted_req_ids=preempted,
        scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=set(resumed)),
    )


def test_slots_follow_requests_and_return_when_they_leave() -> None:
    cache, batch = _state_cache(max_num_seqs=2)
    assert cache.slots.dummy_slot == 2
    batch.req_ids = ["a", "b"]
    cache.after_update()
    assert (cache.slots["a"], cache.slots["b"]) == (0, 1)
    batch.req_ids = ["b", "a"]  # rows move: slots stay with their requests
    cache.after_update()
    assert (cache.slots["a"], cache.slots["b"]) == (0, 1)
    cache.before_update(_step(finished={"a"}, preempted={"b"}))
    batch.req_ids = ["c", "d"]
    cache.after_update()
    assert {cache.slots["c"], cache.slots["d"]} == {0, 1}
    # Resumed without notice (reset_prefix_cache): a new slot, to restore.
    cache.before_update(_step(resumed={"c"}))
    assert cache.slots.assign(["d", "c"]) == {"c"}
    with pytest.raises(KeyError):
        cache.slots["a"]


def test_slots_run_out_with_a_clear_error() -> None:
    slots = StateSlots(1)
    slots.assign(["a"])
    with pytest.raises(RuntimeError, match="No state slot left for request b"):
        slots.assign(["b"])


def test_states_bound_through_vllm_views_with_a_dummy_slot() -> None:
    cache, _ = _state_cache(max_num_seqs=3)
    page = 4 * (3 * 144 + 8 * 16 * 8)
    assert cache.num_bytes == 2 * 4 * page  # 2 layers, 3 slots + the dummy
    cache.allocate()
    conv, ssm = cache.layers["m0"].kv_cache
    assert conv.shape == (4, *CONV) and ssm.shape == (4, *SSM)
    assert conv.dtype == ssm.dtype == torch.float32
    ssm[1].fill_(2.0)  # one slot's state leaves its neighbours and conv alone
    assert ssm[0].abs().sum() == 0 and conv.abs().sum() == 0
    assert cache.layers["m2"].kv_cache[1] is not ssm
    cache.free()
    assert cache.layers["m0"].kv_cache[1].shape[0] == 0


def _hybrid_config() -> tuple[dict[str, Any], KVCacheConfig]:
    """Granite-4.0-H's layout: attention at layer 1, states at 0, 2 and 3 (vLLM
    puts state layers in groups of their own)."""
    layers = {"m0": _StateLayer(), "a1": _AttentionLayer(), "m2": _StateLayer()}
    config = KVCacheConfig(
        num_blocks=6,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["m0"], STATE),
            KVCacheGroupSpec(["a1"], FULL),
            KVCacheGroupSpec(["m2"], STATE),
        ],
    )
    return layers, config


def test_kv_cache_helpers_pass_state_groups_by() -> None:
    layers, config = _hybrid_config()
    vllm_config = SimpleNamespace(
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False)
    )
    specs = kv_cache_specs(layers, vllm_config, 16)  # type: ignore[arg-type]
    assert specs["m0"] is STATE and specs["a1"] == FULL
    attention = {"a1": layers["a1"]}
    caches = bind_kv_caches(attention, config, CPU)
    assert list(caches) == ["a1"]
    assert layer_groups(config, {}) == {"a1": 1}
    cache = group_cache_geometry(attention, config, torch.float32, CPU)
    assert cache.block_size == 16  # state groups' 256-token blocks ignored
    assert [g.holds_states for g in cache.group_geometries()] == [True, False, True]
    assert reachable_decode_blocks(config, 8, 256) == 6


def _pass(
    is_prompt: bool,
    seqs: list[ScheduledSeq],
    batch_size: int,
    query_len: int = 1,
    first_token_indices: list[int] | None = None,
) -> Any:
    """A planned pass; ``query_len`` > 1 without a prompt: a verification."""
    num_tokens = batch_size * query_len
    return SimpleNamespace(
        is_prompt=is_prompt,
        seqs=seqs,
        bucket=SimpleNamespace(batch_size=batch_size, query_len=query_len),
        first_token_indices=first_token_indices or list(range(len(seqs))),
        num_tokens=num_tokens,
        state_metadata=None,
        state_checkpoints=None,
    )


def _seq(row: int, num_computed: int, num_scheduled: int) -> ScheduledSeq:
    return ScheduledSeq(row=row, layout=SeqLayout([0], num_computed, num_scheduled))


def test_planned_passes_carry_each_rows_slot() -> None:
    cache, batch = _state_cache(max_num_seqs=4)
    batch.req_ids = ["a", "b", "c"]
    cache.after_update()
    batch.req_ids = ["c", "a", "b"]  # the batch condensed: rows moved
    prompt = _pass(True, [_seq(1, 0, 7), _seq(0, 16, 5)], 4)
    decode = _pass(False, [_seq(2, 33, 1)], 2)
    cache.add_metadata([prompt, decode])
    meta = prompt.state_metadata
    assert meta.is_prompt
    assert meta.state_slots.tolist() == [0, 2, 4, 4]  # a, c, dummy, dummy
    assert meta.has_initial_state.tolist() == [False, True, False, False]
    assert meta.query_lens.tolist() == [7, 5, 0, 0]
    assert decode.state_metadata.state_slots.tolist() == [1, 4]  # b, dummy
    assert cache.metadata_by_layer(decode) == dict.fromkeys(
        ["m0", "m2"], decode.state_metadata
    )


def test_unplanned_pass_runs_every_row_on_the_dummy_slot() -> None:
    cache, _ = _state_cache(max_num_seqs=4)
    meta = cache.metadata_by_layer(_pass(True, [_seq(0, 0, 64)], 2))["m0"]
    assert meta.state_slots.tolist() == [4, 4]
    assert not meta.has_initial_state.any()


def test_worker_leaves_the_state_slots_out_of_the_kv_cache_budget() -> None:
    from vllm_hpu.worker.hpu_worker import HpuWorker

    cache, _ = _state_cache(max_num_seqs=3)
    worker = HpuWorker.__new__(HpuWorker)
    worker.cache_config = SimpleNamespace(kv_cache_memory_bytes=1 << 20)
    worker.model_runner = SimpleNamespace(kv_cache_share=cache.kv_cache_share)
    assert worker.determine_available_memory() == (1 << 20) - cache.num_bytes


def test_verification_keeps_a_snapshot_per_token_and_resumes_the_accepted() -> None:
    """Three drafts: a verification row of 4 tokens steps its slot token by
    token, keeping each state in its own snapshot page; the next pass copies
    the snapshot of the last accepted token (vLLM resumed the request right
    after it) into the slot."""
    cache, batch = _state_cache(max_num_seqs=2, num_speculative_tokens=3)
    assert cache.slots.num_pages == 3 + 2 * 4
    page = 4 * (3 * 144 + 8 * 16 * 8)
    assert cache.num_bytes == 2 * 11 * page
    batch.req_ids = ["a", "b"]
    cache.after_update()
    # a: last token and 3 drafts at flat 0..3; b: no drafts, at flat 4.
    verify = _pass(False, [_seq(0, 40, 4), _seq(1, 9, 1)], 2, 4, [0, 4])
    cache.add_metadata([verify])
    rows = verify.state_metadata.verify
    assert rows.tokens.tolist()[:2] == [[0, 1, 2, 3], [4, 8, 8, 8]]
    assert rows.slots.tolist()[:2] == [[0, 0, 0, 0], [1, 2, 2, 2]]
    assert rows.snapshots.tolist()[:2] == [[3, 4, 5, 6], [7, 2, 2, 2]]
    assert rows.tokens.shape == (8, 4) and (rows.slots[2:] == 2).all()
    assert verify.state_metadata.accepted is None
    cache.allocate()
    conv = cache.layers["m0"].kv_cache[0]
    conv[5].fill_(7.0)  # a's state after its second draft
    # a accepted 2 drafts: it resumes at 40 + 3; b at 10.
    decode = _pass(False, [_seq(0, 43, 1), _seq(1, 10, 1)], 2)
    cache.add_metadata([decode])
    accepted = decode.state_metadata.accepted
    assert (accepted.src.tolist(), accepted.dst.tolist()) == ([5, 7], [0, 1])
    cache.before_pass(decode)
    assert (conv[0] == 7.0).all()


def test_verified_request_preempted_forgets_its_snapshots() -> None:
    cache, batch = _state_cache(max_num_seqs=2, num_speculative_tokens=1)
    batch.req_ids = ["a"]
    cache.after_update()
    cache.add_metadata([_pass(False, [_seq(0, 20, 2)], 1, 2)])
    cache.before_update(_step(preempted={"a"}))
    cache.after_update()
    prompt = _pass(True, [_seq(0, 0, 16)], 1)
    cache.add_metadata([prompt])
    assert prompt.state_metadata.accepted is None


def test_verify_steps_run_each_row_token_by_token() -> None:
    """attention/state_layers.verify_steps with a running sum for a state
    layer: token j of a row sees the sum up to it, which snapshot j keeps."""
    from vllm_hpu.attention.state_layers import verify_steps
    from vllm_hpu.attention.state_metadata import HpuStateMetadata, VerifyRows

    state = torch.zeros(6, 2)  # slots 0-1, dummy 2, snapshots 3-5 of slot 0

    def add(x: torch.Tensor, metadata: Any) -> torch.Tensor:
        slots = metadata.state_slots
        state.index_add_(0, slots, x)
        return state.index_select(0, slots).clone()

    tokens = torch.tensor([[1, 2, 3], [0, 5, 5]])  # row 1: one token; 5 is none
    metadata = HpuStateMetadata(
        is_prompt=False,
        state_slots=torch.tensor([0, 1]),
        has_initial_state=torch.tensor([True, True]),
        query_lens=torch.tensor([3, 1]),
        verify=VerifyRows(
            tokens=tokens,
            slots=torch.tensor([[0, 0, 0], [1, 2, 2]]),
            snapshots=torch.tensor([[3, 4, 5], [2, 2, 2]]),
        ),
    )
    x = torch.arange(10.0).view(5, 2)
    out = verify_steps([state], metadata, add, x)
    sums = x[1:4].cumsum(0)
    torch.testing.assert_close(out[1:4], sums)
    torch.testing.assert_close(state[3:6], sums)  # the snapshots
    torch.testing.assert_close(out[0], x[0])
    torch.testing.assert_close(state[1], x[0])
    assert (out[4] == 0).all()  # padding
