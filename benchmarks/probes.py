"""Non-invasive measurements inside a benchmark process running this plugin.

Class methods of the runner, vLLM's sampler and logits processor are wrapped with
timers in the benchmark's own process (the engine runs in-process); the plugin's
code is unchanged.
"""

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import torch._dynamo.utils
import torch.profiler
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.v1.sample.sampler import Sampler

import vllm_hpu.attention.backend as attention_backend
from benchmarks.results_schema import SystemResult
from vllm_hpu.bucketing import HpuBucketManager, PaddingStats
from vllm_hpu.worker.hpu_worker import HpuWorker
from vllm_hpu.worker.model_runner import HpuModelRunner

# Every distinct padded shape the runner ran: each is one graph to compile on Gaudi.
SHAPES_RUN: set[tuple[str, tuple[int, ...]]] = set()
WARMUP_S: list[float] = []


def _record_shapes(phase: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def find(self: HpuBucketManager, *args: Any) -> Any:
        bucket = method(self, *args)
        SHAPES_RUN.add((phase, tuple(bucket)))
        return bucket

    return find


def _time_warmup(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def compile_or_warm_up_model(self: HpuWorker) -> Any:
        started = time.perf_counter()
        try:
            return method(self)
        finally:
            WARMUP_S.append(time.perf_counter() - started)

    return compile_or_warm_up_model


def install_plugin_probes() -> None:
    """Record the shapes run and the warmup time (this process only)."""
    manager = HpuBucketManager
    manager.find_prompt_bucket = _record_shapes(  # type: ignore[method-assign]
        "prompt", manager.find_prompt_bucket
    )
    manager.find_decode_bucket = _record_shapes(  # type: ignore[method-assign]
        "decode", manager.find_decode_bucket
    )
    HpuWorker.compile_or_warm_up_model = _time_warmup(  # type: ignore[method-assign]
        HpuWorker.compile_or_warm_up_model
    )


def reset_padding_stats(worker: Any) -> None:
    """Count padding of the timed workload only (not of the warm-up request)."""
    worker.model_runner.buckets.stats = PaddingStats()
    SHAPES_RUN.clear()


def _bucket_figures(worker: Any) -> tuple[dict[str, int], dict[str, float]]:
    buckets = worker.model_runner.buckets
    stats = buckets.stats
    counts = {
        "prompt": len(buckets.prompt_buckets),
        "decode": len(buckets.decode_buckets),
        "shapes_run": len(SHAPES_RUN),
    }
    padding = {
        "prompt": stats.prompt.ratio,
        "decode_batch": stats.decode_batch.ratio,
        "decode_blocks": stats.decode_blocks.ratio,
        "verify": stats.verify.ratio,
    }
    return counts, padding


def collect_plugin_figures(llm: Any, result: SystemResult) -> None:
    result.buckets, result.padding = llm.collective_rpc(_bucket_figures)[0]
    result.warmup_s = sum(WARMUP_S)
    result.compiled_graphs = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


@dataclasses.dataclass
class StepTimes:
    """Seconds spent in one engine step, by part; nested parts are included in
    their callers (the forward inside execute_model, the sampler in sample_tokens)."""

    decode_batch: int  # sequences decoded; 0 when the step held a prompt
    execute: float = 0.0
    forward: float = 0.0
    logits: float = 0.0
    sample: float = 0.0
    sampler: float = 0.0

    @property
    def input_and_output(self) -> float:
        """Host work outside the model forward, lm_head and sampler."""
        return self.execute + self.sample - self.forward - self.logits - self.sampler


STEPS: list[StepTimes] = []


def _timed(part: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            if STEPS:
                step = STEPS[-1]
                elapsed = time.perf_counter() - started
                setattr(step, part, getattr(step, part) + elapsed)

    return timed


def _new_step(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def execute_model(self: HpuModelRunner, scheduler_output: Any, *args: Any) -> Any:
        counts = scheduler_output.num_scheduled_tokens.values()
        decode_only = bool(counts) and all(n == 1 for n in counts)
        STEPS.append(StepTimes(decode_batch=len(counts) if decode_only else 0))
        return method(self, scheduler_output, *args)

    return execute_model


def install_step_timers() -> None:
    """Time every engine step's parts into STEPS (this process only)."""
    runner = HpuModelRunner
    runner._forward = _timed("forward", runner._forward)  # type: ignore[method-assign]
    runner.sample_tokens = _timed("sample", runner.sample_tokens)  # type: ignore[method-assign]
    runner.execute_model = _new_step(_timed("execute", runner.execute_model))  # type: ignore[method-assign]
    LogitsProcessor.forward = _timed("logits", LogitsProcessor.forward)  # type: ignore[method-assign]
    Sampler.forward = _timed("sampler", Sampler.forward)  # type: ignore[method-assign]


# The attention backend's ops, by the region of a profile their operators count in.
ATTENTION_REGIONS = {
    "decode attention": ("paged_attention",),
    "prompt attention": ("prompt_attention", "gather_context"),
}


def _marked(region: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def marked(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function(region):
            return function(*args, **kwargs)

    return marked


def mark_attention_regions() -> None:
    """Name the attention ops' regions in a torch profile (this process only): the
    backend calls them through its module's globals, which are wrapped here."""
    for region, functions in ATTENTION_REGIONS.items():
        for name in functions:
            marked = _marked(region, getattr(attention_backend, name))
            setattr(attention_backend, name, marked)
