"""Plugin metrics for Gaudi operators: bucket hits and misses, padding,
compilations; prometheus_client objects in the worker, counted from the end of
warmup, logged every VLLM_LOG_STATS_INTERVAL seconds and at shutdown."""

import dataclasses
import functools
import time

import prometheus_client
import torch._dynamo.utils
import vllm.envs
from vllm.logger import init_logger

from vllm_hpu import device
from vllm_hpu.bucketing import HpuBucketManager

logger = init_logger("vllm.hpu.metrics")

PHASES = ("prompt", "decode")
PADDING_KINDS = ("prompt_tokens", "decode_tokens", "decode_blocks", "verify_tokens")


def compile_count() -> int:
    """Graphs torch.compile has built in this process so far."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


@dataclasses.dataclass(frozen=True)
class _Collectors:
    hits: prometheus_client.Counter
    misses: prometheus_client.Counter
    padding_ratio: prometheus_client.Gauge
    compilations: prometheus_client.Counter
    device_memory: prometheus_client.Gauge


@functools.cache
def _collectors() -> _Collectors:
    """Registered once per process, in the default registry that vLLM's /metrics
    serves (through PROMETHEUS_MULTIPROC_DIR when the engine is another process)."""
    collectors = _Collectors(
        hits=prometheus_client.Counter(
            "vllm_hpu:bucket_hits",
            "Forward passes padded to a configured (warmed-up) bucket.",
            ["phase"],
        ),
        misses=prometheus_client.Counter(
            "vllm_hpu:bucket_misses",
            "Forward passes whose shape fell outside every configured bucket.",
            ["phase"],
        ),
        padding_ratio=prometheus_client.Gauge(
            "vllm_hpu:padding_ratio",
            "Share of the computed shape that was padding, since warmup.",
            ["kind"],
            multiprocess_mode="mostrecent",
        ),
        compilations=prometheus_client.Counter(
            "vllm_hpu:compilations_after_warmup",
            "Graph compilations after warmup (each one stalls a step).",
        ),
        device_memory=prometheus_client.Gauge(
            "vllm_hpu:device_memory_used_bytes",
            "Device memory in use (the emulated meter in CPU emulation), read "
            "every VLLM_LOG_STATS_INTERVAL seconds.",
            multiprocess_mode="mostrecent",
        ),
    )
    for phase in PHASES:  # children exist from the start, so they read 0
        collectors.hits.labels(phase=phase)
        collectors.misses.labels(phase=phase)
    return collectors


@dataclasses.dataclass
class _Snapshot:
    """Cumulative counts at one moment; padding as (real, padded) per kind."""

    hits: dict[str, int]
    misses: dict[str, int]
    padding: dict[str, tuple[int, int]]
    compilations: int

    @classmethod
    def take(cls, buckets: HpuBucketManager) -> "_Snapshot":
        stats = buckets.stats
        counters = (stats.prompt, stats.decode_batch, stats.decode_blocks, stats.verify)
        padding = {
            kind: (counter.real, counter.padded)
            for kind, counter in zip(PADDING_KINDS, counters, strict=True)
        }
        return cls(dict(buckets.hits), dict(buckets.misses), padding, compile_count())

    def since(self, start: "_Snapshot") -> "_Snapshot":
        return _Snapshot(
            hits={p: self.hits[p] - start.hits[p] for p in PHASES},
            misses={p: self.misses[p] - start.misses[p] for p in PHASES},
            padding={
                kind: (real - start.padding[kind][0], padded - start.padding[kind][1])
                for kind, (real, padded) in self.padding.items()
            },
            compilations=self.compilations - start.compilations,
        )

    def padding_ratios(self) -> dict[str, float]:
        """padded / (real + padded) per kind."""
        return {
            kind: padded / (real + padded) if real + padded else 0.0
            for kind, (real, padded) in self.padding.items()
        }


class HpuMetrics:
    """Publishes what one bucket manager sees after warmup; built on the first step."""

    def __init__(self, buckets: HpuBucketManager) -> None:
        self.buckets = buckets
        self.collectors = _collectors()
        self._warmed_up = _Snapshot.take(buckets)
        self._published = self._warmed_up
        self._last_log = time.monotonic()

    def since_warmup(self) -> _Snapshot:
        return _Snapshot.take(self.buckets).since(self._warmed_up)

    def observe_step(self) -> None:
        """Publish the counts of the step that just ran; log on the stats period."""
        self.publish()
        if time.monotonic() - self._last_log >= vllm.envs.VLLM_LOG_STATS_INTERVAL:
            self.collectors.device_memory.set(device.memory_used())
            self.log()

    def publish(self) -> None:
        now = _Snapshot.take(self.buckets)
        step = now.since(self._published)
        for phase in PHASES:
            self.collectors.hits.labels(phase=phase).inc(step.hits[phase])
            self.collectors.misses.labels(phase=phase).inc(step.misses[phase])
        self.collectors.compilations.inc(step.compilations)
        for kind, ratio in now.since(self._warmed_up).padding_ratios().items():
            self.collectors.padding_ratio.labels(kind=kind).set(ratio)
        self._published = now

    def describe(self) -> str:
        counts = self.since_warmup()
        lookups = ", ".join(
            f"{phase} {counts.hits[phase]} hits / {counts.misses[phase]} misses"
            for phase in PHASES
        )
        padding = ", ".join(
            f"{kind} {ratio:.1%}" for kind, ratio in counts.padding_ratios().items()
        )
        return (
            f"HPU metrics since warmup: buckets {lookups}; padding {padding}; "
            f"compilations {counts.compilations}"
        )

    def log(self) -> None:
        self._last_log = time.monotonic()
        logger.info(self.describe())
