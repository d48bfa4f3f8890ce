"""Plugin metrics: bucket hits and misses, padding ratios and compilations, counted
from the end of warmup and published to prometheus_client's default registry."""

import prometheus_client
import torch

from vllm_hpu.bucketing import BucketingConfig, HpuBucketManager, ServingLimits
from vllm_hpu.envs import read_envs
from vllm_hpu.worker.diagnostics.metrics import HpuMetrics, compile_count

LIMITS = ServingLimits(128, 4096, 1024, 128)  # prompt buckets up to (4, 1024)
ENVIRON = {"VLLM_PROMPT_BS_BUCKET_MAX": "4", "VLLM_PROMPT_SEQ_BUCKET_MAX": "1024"}


def make_manager() -> HpuBucketManager:
    manager = HpuBucketManager(BucketingConfig.from_limits(LIMITS, read_envs(ENVIRON)))
    manager.set_num_kv_blocks(4096)
    return manager


def sample(name: str, **labels: str) -> float:
    value = prometheus_client.REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


def run_prompt(manager: HpuBucketManager, batch_size: int, query_len: int) -> None:
    bucket = manager.find_prompt_bucket(batch_size, query_len, 0)
    manager.stats.record_prompt(bucket, [query_len] * batch_size)


def test_manager_counts_hits_and_every_use_of_a_missed_shape():
    manager = make_manager()
    run_prompt(manager, 1, 100)
    for _ in range(2):
        run_prompt(manager, 1, 5000)  # beyond every bucket: a miss, twice
    manager.find_decode_bucket(3, 10)
    assert manager.hits == {"prompt": 1, "decode": 1}
    assert manager.misses == {"prompt": 2, "decode": 0}


def test_metrics_count_from_warmup_and_publish_deltas():
    manager = make_manager()
    run_prompt(manager, 1, 128)  # during warmup: not counted
    metrics = HpuMetrics(manager)
    hits_before = sample("vllm_hpu:bucket_hits_total", phase="prompt")
    misses_before = sample("vllm_hpu:bucket_misses_total", phase="prompt")
    run_prompt(manager, 1, 64)  # 64 real tokens in a 128-token bucket
    metrics.publish()
    run_prompt(manager, 1, 5000)
    metrics.publish()
    assert sample("vllm_hpu:bucket_hits_total", phase="prompt") == hits_before + 1
    assert sample("vllm_hpu:bucket_misses_total", phase="prompt") == misses_before + 1
    ratio = sample("vllm_hpu:padding_ratio", kind="prompt_tokens")
    assert ratio == (64 + 120) / (128 + 5120)  # 5000 tokens padded past 1024 to 5120
    counts = metrics.since_warmup()
    assert counts.hits["prompt"] == 1 and counts.misses["prompt"] == 1


def test_metrics_count_compilations_after_warmup(vllm_log):
    metrics = HpuMetrics(make_manager())
    before = sample("vllm_hpu:compilations_after_warmup_total")
    compiled = torch.compile(lambda x: x * 2 + 1, backend="eager")
    compiled(torch.ones(3))
    assert compile_count() >= 1
    metrics.publish()
    assert sample("vllm_hpu:compilations_after_warmup_total") == before + 1
    metrics.log()
    assert vllm_log.messages()[-1] == (
        "HPU metrics since warmup: buckets prompt 0 hits / 0 misses, decode 0 hits "
        "/ 0 misses; padding prompt_tokens 0.0%, decode_tokens 0.0%, "
        "decode_blocks 0.0%, verify_tokens 0.0%; compilations 1"
    )
