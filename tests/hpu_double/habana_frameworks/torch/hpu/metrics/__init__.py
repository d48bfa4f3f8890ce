"""Bridge metrics (bridge v1.19.0 hpu/metrics/metrics.py): ``metric_global``
returns a metric whose ``stats()`` is a list of (tag, value) pairs."""

from habana_frameworks.torch.hpu.metrics.metrics import (
    metric_global,
    metric_localcontext,
)

__all__ = ["metric_global", "metric_localcontext"]
