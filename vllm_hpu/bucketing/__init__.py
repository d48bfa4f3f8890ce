"""Bucketing: the fixed shapes every forward pass is padded to, so Gaudi's graph
compiler sees a small, pre-compiled set. See docs/bucketing.md."""

from vllm_hpu.bucketing.buckets import Bucket
from vllm_hpu.bucketing.manager import HpuBucketManager
from vllm_hpu.bucketing.padding import PaddingStats, TraceStep, measure_padding
from vllm_hpu.bucketing.ranges import BucketRange, exponential_range, linear_range
from vllm_hpu.bucketing.settings import BucketingConfig, ServingLimits

__all__ = [
    "Bucket",
    "BucketRange",
    "BucketingConfig",
    "HpuBucketManager",
    "PaddingStats",
    "ServingLimits",
    "TraceStep",
    "exponential_range",
    "linear_range",
    "measure_padding",
]
