"""Warm restarts: compiled graphs kept across processes in VLLM_HPU_CACHE_DIR. In
emulation torch.compile's caches live in a folder per configuration, named by a
hash of all the graphs depend on (vLLM's graph hash, buckets, KV block count,
backend, plugin and torch versions): a restart loads its graphs, never a stale
one. On Gaudi the bridge's recipe cache does this (device.py)."""

import contextlib
import hashlib
import importlib.metadata
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from torch._dynamo.utils import counters
from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir
from vllm.config import VllmConfig
from vllm.logger import init_logger

from vllm_hpu.bucketing import Bucket

logger = init_logger("vllm.hpu.compile_cache")


def cache_key(
    vllm_config: VllmConfig,
    buckets: tuple[list[Bucket], list[Bucket]],
    num_kv_blocks: int,
    backend: str,
    fullgraph: bool,
) -> str:
    """What the compiled graphs of this configuration depend on, hashed."""
    factors = {
        "vllm": vllm_config.compute_hash(),
        "prompt_buckets": buckets[0],
        "decode_buckets": buckets[1],
        "num_kv_blocks": num_kv_blocks,
        "backend": backend,
        "fullgraph": fullgraph,
        "plugin": importlib.metadata.version("vllm-hpu"),
        "torch": torch.__version__,
    }
    return hashlib.sha256(json.dumps(factors).encode()).hexdigest()[:16]


def graphs_compiled() -> tuple[int, int]:
    """Graphs torch.compile loaded from its caches so far, and graphs it compiled."""
    return (
        int(counters["inductor"]["fxgraph_cache_hit"]),
        int(counters["inductor"]["fxgraph_cache_miss"]),
    )


def saved_graphs(folder: Path) -> int:
    """Compiled graphs an earlier start left in ``folder`` (one entry each)."""
    return sum(1 for _ in folder.glob("fxgraph/*/*/*"))


@contextlib.contextmanager
def compile_cache(folder: Path) -> Iterator[None]:
    """Compile into ``folder`` meanwhile; say how many graphs came from it."""
    logger.info(
        "Compile cache %s: %d graphs saved by earlier starts",
        folder,
        saved_graphs(folder),
    )
    hits_before, misses_before = graphs_compiled()
    with temporary_cache_dir(str(folder)):
        yield
    hits, misses = graphs_compiled()
    reused, compiled = hits - hits_before, misses - misses_before
    logger.info(
        "Compile cache: %d of %d graphs came from the cache, %d compiled "
        "(VLLM_HPU_CACHE_DIR)",
        reused,
        reused + compiled,
        compiled,
    )
