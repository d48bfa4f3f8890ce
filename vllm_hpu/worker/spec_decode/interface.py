"""The seam between the runner and speculative decoding: what a proposer reads
from the target's runner (``TargetRunner``, which ``HpuModelRunner`` implements)
and what the runner asks of a proposer (``Proposer``). Nothing in this package
imports the runner."""

from typing import Any, Protocol

import torch
from vllm.config import VllmConfig
from vllm.v1.worker.gpu_input_batch import InputBatch

from vllm_hpu.attention.metadata import CacheGeometry
from vllm_hpu.bucketing import HpuBucketManager
from vllm_hpu.worker.compilation.execution import (
    CompileOptions,
    ExecutionMode,
    GraphKey,
)
from vllm_hpu.worker.passes.forward_pass import ForwardPass
from vllm_hpu.worker.state.request_states import RequestStates


class TargetRunner(Protocol):
    """The target's runner as its parts see it: read, never changed."""

    @property
    def vllm_config(self) -> VllmConfig: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def block_size(self) -> int: ...

    @property
    def input_batch(self) -> InputBatch: ...  # vLLM's rows: tokens, drafts

    @property
    def states(self) -> RequestStates: ...  # per request: its block tables

    @property
    def layer_groups(self) -> dict[str, int]: ...  # attention layer: KV cache group

    @property
    def buckets(self) -> HpuBucketManager: ...  # the draft's passes pad as the target's

    @property
    def cache(self) -> CacheGeometry | None: ...  # set by initialize_kv_cache

    @property
    def execution_mode(self) -> ExecutionMode: ...

    @property
    def graphed_buckets(self) -> set[GraphKey]: ...  # warmup's, shared

    def get_model(self) -> Any:
        """The target model (loaded before any proposer loads its own)."""


class Proposer:
    """What the runner asks of a proposer; this one drafts nothing."""

    def load_model(self) -> None:
        pass

    def prepare(self, mode: ExecutionMode, options: CompileOptions | None) -> None:
        pass

    def after_target_pass(self, forward_pass: ForwardPass, hidden: Any) -> Any:
        """Returns the target's hidden states (unwrapped where it returns more)."""
        return hidden

    def propose(self, num_drafts: int, sampled: list[list[int]]) -> list[list[int]]:
        return [[] for _ in sampled]
