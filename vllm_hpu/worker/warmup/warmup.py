"""Warmup: one engine step per bucket through the real step path, before serving.
Synthetic scheduler outputs land on each bucket (hpu-algorithms.md section 5),
so every served shape compiles here; with graphs, the capture budget picks
which buckets get them (section 6)."""

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from vllm.logger import init_logger
from vllm.pooling_params import PoolingParams
from vllm.sampling_params import SamplingParams
from vllm.utils.math_utils import cdiv
from vllm.utils.mem_utils import format_gib
from vllm.v1.core.sched.output import (
    CachedRequestData,
    NewRequestData,
    SchedulerOutput,
)

from vllm_hpu import device
from vllm_hpu.bucketing import Bucket
from vllm_hpu.bucketing.buckets import context_tokens
from vllm_hpu.bucketing.padding import PaddingStats
from vllm_hpu.envs import get_envs
from vllm_hpu.worker.capabilities.pooling import supported_pooling_tasks
from vllm_hpu.worker.compilation.compile_cache import cache_key, compile_cache
from vllm_hpu.worker.compilation.execution import CompileOptions
from vllm_hpu.worker.compilation.graphs import (
    DECODE,
    PROMPT,
    CapturePlan,
    capture_graphs,
    describe_budget,
    left_out_message,
)
from vllm_hpu.worker.model_runner import HpuModelRunner
from vllm_hpu.worker.passes.synthetic import merged_fake_chunks

logger = init_logger("vllm.hpu.warmup")

REQ_PREFIX = "hpu-warmup-"


@dataclass(frozen=True)
class FakeSeq:
    """A synthetic request of ``num_tokens``: the first ``num_computed`` cached, the
    rest scheduled now, then ``num_drafts`` draft tokens to verify."""

    num_tokens: int
    num_computed: int
    num_drafts: int = 0


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Warmup samples tokens: it must not shift the seeded sampling that follows."""
    state = torch.get_rng_state()
    try:
        yield
    finally:
        torch.set_rng_state(state)


class HpuWarmup:
    def __init__(self, runner: HpuModelRunner, graph_mem: int) -> None:
        self.runner = runner
        self.graph_mem = graph_mem  # bytes for graphs; 0: capture nothing
        self.block_size = runner.block_size
        # The sampled token needs a slot too: a sequence stops one short.
        self.max_len = runner.model_config.max_model_len - 1
        self.max_num_seqs = runner.vllm_config.scheduler_config.max_num_seqs
        self._next_id = 0
        self._next_block = 0

    # ---- synthetic requests ----------------------------------------------

    def prompt_seqs(self, bucket: Bucket) -> list[FakeSeq] | None:
        """Requests whose prompt pass pads to ``bucket`` (None if none can): largest
        first, most context blocks and rows, then the longest chunk allowed."""
        if self.runner.buckets.config.merged_prefill:
            return self._merged_prompt_seqs(bucket)
        for blocks in range(bucket.num_blocks, -1, -1):
            context = context_tokens(blocks, self.block_size)
            for num_seqs in range(min(bucket.batch_size, self.max_num_seqs), 0, -1):
                query_len = min(
                    bucket.query_len,
                    self.max_len - context,
                    self.runner.max_num_tokens // num_seqs,
                )
                # A single scheduled token would make the row a decode.
                if query_len < 2:
                    continue
                found = self.runner.buckets.covering_prompt_bucket(
                    num_seqs, query_len, blocks
                )
                rows = self._prompt_rows(context, query_len, num_seqs)
                if found == bucket and rows is not None:
                    return rows
        return None

    def _prompt_rows(
        self, context: int, query_len: int, num_seqs: int
    ) -> list[FakeSeq] | None:
        """``num_seqs`` rows of ``query_len`` after ``context`` cached, own blocks each;
        if the KV cache is too small later rows lack context, or None if none fit."""
        assert self.runner.cache is not None, "initialize_kv_cache() first"
        row = FakeSeq(context + query_len, context)
        first = cdiv(row.num_tokens, self.block_size)
        others = cdiv(query_len, self.block_size) * (num_seqs - 1)
        if first * num_seqs <= self.runner.cache.num_blocks:
            return [row] * num_seqs
        if first + others <= self.runner.cache.num_blocks:
            return [row] + [FakeSeq(query_len, 0)] * (num_seqs - 1)
        return None

    def _merged_prompt_seqs(self, bucket: Bucket) -> list[FakeSeq] | None:
        """Requests packing into ``bucket``, the most context first; at most as many
        tokens as the first ``max_num_seqs`` requests take."""
        size, max_len = self.block_size, self.max_len
        for blocks in range(bucket.num_blocks, -1, -1):
            chunks = merged_fake_chunks(bucket, blocks, size, max_len)
            if len(chunks) > self.max_num_seqs:
                held = sum(n - c for n, c in chunks[: self.max_num_seqs])
                fewer = bucket._replace(query_len=held)
                chunks = merged_fake_chunks(fewer, blocks, size, max_len)
            if not chunks or len(chunks) > self.max_num_seqs:
                continue
            shape = (1, sum(n - c for n, c in chunks), blocks)
            if self.runner.buckets.covering_prompt_bucket(*shape) == bucket:
                return [FakeSeq(n, c) for n, c in chunks]
        return None

    def decode_seqs(self, bucket: Bucket) -> list[FakeSeq]:
        """Sequences holding ``bucket.num_blocks`` blocks, each decoding a token at its
        last block's end; for verification (Q > 1), that token and Q - 1 drafts."""
        num_seqs = min(bucket.batch_size, self.max_num_seqs, bucket.num_blocks)
        num_drafts = bucket.query_len - 1
        seqs = []
        for i in range(num_seqs):
            blocks = bucket.num_blocks // num_seqs + (i < bucket.num_blocks % num_seqs)
            seq_len = min(blocks * self.block_size, self.max_len) - num_drafts
            seqs.append(FakeSeq(seq_len, seq_len - 1, num_drafts))
        return seqs

    def _new_request(self, seq: FakeSeq) -> NewRequestData:
        assert self.runner.cache is not None, "initialize_kv_cache() first"
        num_kv_blocks = self.runner.cache.num_blocks
        # Own blocks: a context block another request writes would split the passes.
        num_blocks = cdiv(seq.num_tokens + seq.num_drafts, self.block_size)
        block_ids = [(self._next_block + j) % num_kv_blocks for j in range(num_blocks)]
        self._next_block += num_blocks
        self._next_id += 1
        sampling_params, pooling_params = self._request_params()
        return NewRequestData(
            req_id=f"{REQ_PREFIX}{self._next_id}",
            prompt_token_ids=[0] * seq.num_tokens,
            mm_features=[],
            sampling_params=sampling_params,
            pooling_params=pooling_params,
            # The same blocks in every KV cache group: only the shapes matter here.
            block_ids=(block_ids,) * len(self.runner.cache.group_geometries()),
            num_computed_tokens=seq.num_computed,
            lora_request=self.runner.caps.lora.warmup_request(self._next_id),
        )

    def _request_params(self) -> tuple[SamplingParams | None, PoolingParams | None]:
        """A warmup request samples one token, or pools with the model's first task."""
        tasks = sorted(supported_pooling_tasks(self.runner.get_model()))
        if not tasks:
            return SamplingParams(temperature=0.0, max_tokens=1), None
        return None, PoolingParams(task=tasks[0])

    def run_step(self, seqs: list[FakeSeq]) -> None:
        """One engine step over new requests ``seqs``, then finish them all."""
        new_reqs = [self._new_request(seq) for seq in seqs]
        drafts = {
            r.req_id: [0] * seq.num_drafts
            for r, seq in zip(new_reqs, seqs, strict=True)
            if seq.num_drafts
        }
        scheduled = {
            r.req_id: len(r.prompt_token_ids or [])
            - r.num_computed_tokens
            + len(drafts.get(r.req_id, []))
            for r in new_reqs
        }
        step = self._scheduler_output(new_reqs, scheduled, set(), drafts)
        if self.runner.execute_model(step) is None:
            self.runner.sample_tokens(None)
        finished = set(scheduled)
        self.runner.execute_model(self._scheduler_output([], {}, finished))

    @staticmethod
    def _scheduler_output(
        new_reqs: list[NewRequestData],
        scheduled: dict[str, int],
        finished: set[str],
        drafts: dict[str, list[int]] | None = None,
    ) -> SchedulerOutput:
        return SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=CachedRequestData.make_empty(),
            num_scheduled_tokens=scheduled,
            total_num_scheduled_tokens=sum(scheduled.values()),
            scheduled_spec_decode_tokens=drafts or {},
            scheduled_encoder_inputs={},
            num_common_prefix_blocks=[],
            finished_req_ids=finished,
            free_encoder_mm_hashes=[],
        )

    # ---- phases ----------------------------------------------------------

    def run(self, capture: bool) -> None:
        """Every bucket, largest first, then a mixed step, then graph capture."""
        started = time.perf_counter()
        used_before = device.memory_used()
        buckets = self.runner.buckets
        prompt = list(reversed(buckets.prompt_buckets))
        # Pooling models run prompt passes only (passes/planner.py).
        pooling = self.runner.is_pooling_model
        decode = [] if pooling else list(reversed(buckets.decode_buckets))
        with preserved_rng():
            self.runner.caps.multimodal.warm_up()
            self._warm_all("Prompt", PROMPT, prompt)
            self._warm_all("Decode", DECODE, decode)
            if not pooling:
                self._run_mixed_step(prompt[-1], decode[-1])
            if capture:
                self._capture(prompt, decode)
        # Warmup's own padding is not what serving pays.
        buckets.stats = PaddingStats()
        logger.info(
            "Warmup finished in %d secs, allocated %s GiB of device memory",
            round(time.perf_counter() - started),
            format_gib(device.memory_used() - used_before),
        )

    def _run_bucket(self, phase: str, bucket: Bucket) -> None:
        seqs = self.prompt_seqs(bucket) if phase == PROMPT else self.decode_seqs(bucket)
        if seqs is None:
            logger.debug("No request within the limits pads to %s: skipped", bucket)
            return
        self.run_step(seqs)

    def _run_mixed_step(self, prompt: Bucket, decode: Bucket) -> None:
        """Prompts and decodes in one step, as the scheduler mixes them."""
        prompt_seqs = self.prompt_seqs(prompt) or []
        decode_seqs = self.decode_seqs(decode)
        if prompt_seqs and len(prompt_seqs) + len(decode_seqs) <= self.max_num_seqs:
            self.run_step(prompt_seqs + decode_seqs)

    def _log_step(self, label: str, index: int, total: int, bucket: Bucket) -> None:
        if label.endswith("Decode"):
            shape = f"batch_size:{bucket.batch_size} num_blocks:{bucket.num_blocks}"
            if bucket.query_len > 1:
                shape += f" queries:{bucket.query_len}"
        else:
            shape = f"batch_size:{bucket.batch_size} seq_len:{bucket.query_len}"
            if bucket.num_blocks:
                shape += f" ctx_blocks:{bucket.num_blocks}"
        free = format_gib(device.mem_get_info()[0])
        logger.info(
            "[Warmup][%s][%d/%d] %s free_mem:%s GiB", label, index, total, shape, free
        )

    def _warm_all(self, label: str, phase: str, buckets: list[Bucket]) -> None:
        for index, bucket in enumerate(buckets, start=1):
            self._log_step(label, index, len(buckets), bucket)
            self._run_bucket(phase, bucket)

    def _capture(self, prompt: list[Bucket], decode: list[Bucket]) -> None:
        envs = get_envs()
        free = device.mem_get_info()[0]
        plan = CapturePlan(
            prompt,
            decode,
            self._graph_budget(free),
            envs.graph_prompt_ratio,
            envs.graph_prompt_strategy,
            envs.graph_decode_strategy,
        )
        logger.info(describe_budget(plan, free))
        totals = {PROMPT: len(prompt), DECODE: len(decode)}
        done = {PROMPT: 0, DECODE: 0}

        def capture(phase: str, bucket: Bucket) -> int:
            done[phase] += 1
            label = f"Graph/{phase.capitalize()}"
            self._log_step(label, done[phase], totals[phase], bucket)
            self.runner.capture_graph(phase, bucket)
            used_before = device.memory_used()
            self._run_bucket(phase, bucket)
            device.synchronize()
            return device.memory_used() - used_before

        phases = capture_graphs(plan, capture, lambda: device.mem_get_info()[0])
        for result in phases:
            logger.info(result.summary(self.runner.buckets.describe))
        message = left_out_message(phases, envs.graph_reserved_mem)
        if message is not None:
            logger.warning(message)

    def _graph_budget(self, free: int) -> int:
        """The reserved share, or what the warmup steps left free if less."""
        if free < self.graph_mem:
            logger.info(
                "Graph memory budget cut from %s GiB (VLLM_GRAPH_RESERVED_MEM) to "
                "the %s GiB free after the warmup steps",
                format_gib(self.graph_mem),
                format_gib(free),
            )
        return min(self.graph_mem, free)


def warm_up_model(runner: HpuModelRunner, graph_mem: int) -> None:
    """Apply the runner's execution mode to the model, warm every bucket up."""
    envs = get_envs()
    options = runner.apply_execution_mode()
    if envs.skip_warmup:
        logger.warning(
            "Skipping warmup (VLLM_SKIP_WARMUP): the first requests compile."
        )
        return
    mode = runner.execution_mode
    if not mode.compiles_shapes:
        logger.info("No warmup: nothing compiles per shape in emulated eager mode.")
        return
    with runner.caps.lora.dummy_adapters(), kept_graphs(runner, options):
        HpuWarmup(runner, graph_mem).run(capture=mode.captures_graphs)
    runner.buckets.mark_warmed(strict=envs.full_warmup)


def kept_graphs(
    runner: HpuModelRunner, options: CompileOptions | None
) -> contextlib.AbstractContextManager[None]:
    """This configuration's folder under VLLM_HPU_CACHE_DIR, with torch.compile."""
    folder = get_envs().cache_dir
    if options is None or not folder or runner.cache is None:
        return contextlib.nullcontext()
    buckets = (runner.buckets.prompt_buckets, runner.buckets.decode_buckets)
    key = cache_key(
        runner.vllm_config,
        buckets,
        runner.cache.num_blocks,
        options.backend,
        options.fullgraph,
    )
    return compile_cache(Path(folder) / f"compiled-{key}")
