"""Warmup's synthetic requests land exactly on their buckets; execution modes."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from vllm_hpu.bucketing import BucketingConfig, HpuBucketManager, ServingLimits
from vllm_hpu.envs import read_envs
from vllm_hpu.worker.compilation.execution import (
    CompileOptions,
    ExecutionMode,
    compile_model,
    select_mode,
)
from vllm_hpu.worker.diagnostics.metrics import compile_count
from vllm_hpu.worker.warmup.warmup import HpuWarmup


def fake_runner(
    limits: ServingLimits, manager: HpuBucketManager, num_kv_blocks: int = 1 << 20
) -> SimpleNamespace:
    """The runner attributes warmup sizes its requests from."""
    return SimpleNamespace(
        buckets=manager,
        cache=SimpleNamespace(num_blocks=num_kv_blocks),
        block_size=limits.block_size,
        max_num_tokens=limits.max_num_batched_tokens,
        model_config=SimpleNamespace(max_model_len=limits.max_model_len),
        vllm_config=SimpleNamespace(
            scheduler_config=SimpleNamespace(max_num_seqs=limits.max_num_seqs)
        ),
    )


LIMITS = [
    ServingLimits(
        max_num_seqs=8,
        max_num_batched_tokens=2048,
        max_model_len=2048,
        block_size=128,
        use_context_buckets=True,
    ),
    ServingLimits(
        max_num_seqs=2,
        max_num_batched_tokens=192,
        max_model_len=128,
        block_size=16,
        use_context_buckets=True,
    ),
    ServingLimits(
        max_num_seqs=5,
        max_num_batched_tokens=512,
        max_model_len=300,
        block_size=16,
        use_context_buckets=False,
    ),
]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


STRATEGIES = [
    {},
    {"VLLM_HPU_BUCKETING_STRATEGY": "linear"},
    {"VLLM_HPU_MERGED_PREFILL": "false"},
    {"VLLM_HPU_BUCKETING_STRATEGY": "linear", "VLLM_HPU_MERGED_PREFILL": "false"},
]


@pytest.mark.parametrize("environ", STRATEGIES)
@pytest.mark.parametrize("limits", LIMITS)
def test_warmup_prompt_requests_land_on_their_bucket(limits, environ):
    config = BucketingConfig.from_limits(limits, read_envs(environ))
    manager = HpuBucketManager(config)
    warmup = HpuWarmup(fake_runner(limits, manager), graph_mem=0)  # type: ignore[arg-type]
    for bucket in manager.prompt_buckets:
        seqs = warmup.prompt_seqs(bucket)
        assert seqs is not None, f"no request lands on {bucket}"
        queries = [s.num_tokens - s.num_computed for s in seqs]
        contexts = [cdiv(s.num_computed, limits.block_size) for s in seqs]
        # Within vLLM's limits, with room left for the sampled token.
        assert all(s.num_tokens < limits.max_model_len for s in seqs)
        assert len(seqs) <= limits.max_num_seqs and min(queries) >= 2
        if config.merged_prefill:  # one packed sequence
            shape = (1, sum(queries), sum(contexts))
            assert sum(queries) <= limits.max_num_batched_tokens
        else:
            shape = (len(seqs), max(queries), max(contexts))
            assert len(seqs) * max(queries) <= limits.max_num_batched_tokens
        assert manager.find_prompt_bucket(*shape) == bucket


def test_warmup_prompt_rows_keep_blocks_of_their_own_in_a_small_cache():
    """9 KV blocks: two rows of 7 context blocks would share blocks (the
    runner would run them apart, batch 1); the second row then starts
    without context and the pass still lands on its bucket; a bucket whose
    rows cannot fit apart at all gets no requests."""
    limits = LIMITS[1]
    config = BucketingConfig.from_limits(
        limits, read_envs({"VLLM_HPU_MERGED_PREFILL": "false"})
    )
    manager = HpuBucketManager(config)
    warmup = HpuWarmup(fake_runner(limits, manager, num_kv_blocks=9), graph_mem=0)  # type: ignore[arg-type]
    contexts_seen = set()
    for bucket in manager.prompt_buckets:
        seqs = warmup.prompt_seqs(bucket)
        if seqs is None:  # no two rows of blocks of their own fit 9 blocks
            assert bucket.batch_size * cdiv(bucket.query_len, 16) > 9, bucket
            continue
        blocks = [cdiv(s.num_tokens, limits.block_size) for s in seqs]
        assert sum(blocks) <= 9, bucket
        queries = [s.num_tokens - s.num_computed for s in seqs]
        contexts = [cdiv(s.num_computed, limits.block_size) for s in seqs]
        shape = (len(seqs), max(queries), max(contexts))
        assert manager.find_prompt_bucket(*shape) == bucket
        contexts_seen.add(tuple(contexts))
    assert any(len(c) == 2 and c[0] > 0 == c[1] for c in contexts_seen)


@pytest.mark.parametrize("environ", STRATEGIES)
@pytest.mark.parametrize("limits", LIMITS)
def test_warmup_decode_requests_land_on_their_bucket(limits, environ):
    config = BucketingConfig.from_limits(limits, read_envs(environ))
    manager = HpuBucketManager(config)
    manager.set_num_kv_blocks(64)
    warmup = HpuWarmup(fake_runner(limits, manager), graph_mem=0)  # type: ignore[arg-type]
    for bucket in manager.decode_buckets:
        seqs = warmup.decode_seqs(bucket)
        assert all(s.num_tokens - s.num_computed == 1 for s in seqs)
        num_blocks = sum(cdiv(s.num_tokens, limits.block_size) for s in seqs)
        assert manager.find_decode_bucket(len(seqs), num_blocks) == bucket


@pytest.mark.parametrize("limits", LIMITS)
def test_warmup_verification_requests_land_on_their_bucket(limits):
    """k = 3: each request verifies 3 drafts, one query group of 4 each;
    the batch-size rungs between decode sizes (3, 6) included."""
    config = BucketingConfig.from_limits(limits, read_envs({}))
    manager = HpuBucketManager(dataclasses.replace(config, verify_queries=4))
    manager.set_num_kv_blocks(64)
    warmup = HpuWarmup(fake_runner(limits, manager), graph_mem=0)  # type: ignore[arg-type]
    verify = [b for b in manager.decode_buckets if b.query_len == 4]
    assert verify
    for bucket in verify:
        seqs = warmup.decode_seqs(bucket)
        assert all(s.num_tokens - s.num_computed == 1 for s in seqs)
        assert all(s.num_drafts == 3 for s in seqs)
        ends = [s.num_tokens + s.num_drafts for s in seqs]
        assert max(ends) <= limits.max_model_len
        num_blocks = sum(cdiv(end, limits.block_size) for end in ends)
        assert manager.find_decode_bucket(len(seqs), num_blocks, 4) == bucket


@pytest.mark.parametrize(
    ("lazy", "enforce_eager", "backend", "mode"),
    [
        (False, False, "hpu_backend", ExecutionMode.COMPILE),
        (False, True, "hpu_backend", ExecutionMode.EAGER),
        (True, False, "hpu_backend", ExecutionMode.HPU_GRAPHS),
        (True, True, "hpu_backend", ExecutionMode.LAZY),
        (False, False, "eager", ExecutionMode.COMPILE),
        (False, False, None, ExecutionMode.EAGER),
    ],
)
def test_execution_mode_from_lazy_mode_and_enforce_eager(
    lazy, enforce_eager, backend, mode
):
    assert select_mode(lazy, enforce_eager, backend) is mode


def test_emulated_modes_warm_up_and_capture_only_when_compiled():
    assert ExecutionMode.COMPILE.compiles_shapes
    assert ExecutionMode.COMPILE.captures_graphs
    assert not ExecutionMode.EAGER.compiles_shapes
    assert not ExecutionMode.EAGER.captures_graphs


class Scale(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


def test_each_compiled_model_adds_its_own_entries_to_dynamos_process_cap():
    """Dynamo counts a code object's compiles for the whole process: a second
    engine's model must still compile, not fall back to eager past the cap."""

    def graphs_for(model, sizes):
        before = compile_count()
        for size in sizes:
            model(torch.ones(size, 4))
        return compile_count() - before

    options = CompileOptions(backend="eager", fullgraph=True, max_entries=2)
    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(
            recompile_limit=1, accumulated_recompile_limit=2
        ):
            first, second = Scale(), Scale()
            compile_model(first, options)
            assert graphs_for(first, [1, 2]) == 2
            compile_model(second, options)
            # The first model's graphs serve the second too: new shapes compile.
            assert graphs_for(second, [1, 2, 3, 4]) == 2
    finally:
        torch._dynamo.reset()
