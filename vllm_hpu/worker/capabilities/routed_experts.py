"""Routed experts returned with the output (``enable_return_routed_experts``, for
RL replay), through vLLM's auxiliary-output connector. vLLM's GPU runner
captures one flat batch per step; our passes are padded (with DP, every rank's
tokens gathered), so each MoE layer's routing (logical ids, before EPLB) lands
in a pass buffer, this rank's real tokens are copied into the step's rows in
vLLM's order, and at step end go to vLLM's capturer, layer by layer."""

import functools
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from vllm.config import VllmConfig
from vllm.distributed.aux_output_connector.worker import AuxOutputWorkerConnector
from vllm.forward_context import set_forward_context
from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.worker.gpu_input_batch import InputBatch

from vllm_hpu.worker.passes.forward_pass import ForwardPass


class _LayerSink(torch.nn.Module):
    """One MoE layer as vLLM's capture binder sees a capture source."""

    def __init__(self, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.capture_fn: Any = None  # set by vLLM's binder


class StepBatch:
    """The step's rows as vLLM's connector reads a GPU batch: scheduled requests in
    batch order, where each one's rows start, and its tokens computed before."""

    def __init__(self, scheduler_output: SchedulerOutput, batch: InputBatch) -> None:
        scheduled = scheduler_output.num_scheduled_tokens
        self.rows = [r for r, i in enumerate(batch.req_ids) if scheduled.get(i, 0)]
        self.req_ids = [batch.req_ids[r] for r in self.rows]
        counts = [scheduled[i] for i in self.req_ids]
        self.query_start_loc_np = np.concatenate([[0], np.cumsum(counts)])
        self.num_computed_tokens_np = batch.num_computed_tokens_cpu[self.rows].copy()
        # A token at position p of batch row r is step row offsets[r] + p.
        starts = self.query_start_loc_np[:-1] - self.num_computed_tokens_np
        self.offsets = dict(zip(self.rows, starts.tolist(), strict=True))


class RoutedExpertsOutput:
    """Routed experts returned; without the option a step's output has none."""

    def start(self, kv_cache_config: KVCacheConfig) -> None:
        pass

    def begin_step(self, scheduler_output: SchedulerOutput) -> None:
        pass

    def before_pass(self, forward_pass: ForwardPass) -> None:
        pass

    def after_pass(self, forward_pass: ForwardPass) -> None:
        pass

    def step_output(
        self, passes: Future[Any], discard_rows: list[int]
    ) -> dict[str, Any] | None:
        return None


class RoutedExpertsCapture(RoutedExpertsOutput):
    def __init__(
        self, vllm_config: VllmConfig, model: torch.nn.Module, batch: InputBatch
    ) -> None:
        self.vllm_config = vllm_config
        self.input_batch = batch
        runners = [m for m in model.modules() if isinstance(m, MoERunner)]
        self.sinks = torch.nn.ModuleList(_LayerSink(r.layer_id) for r in runners)
        self.num_layers = vllm_config.model_config.get_total_num_hidden_layers()
        self.top_k = vllm_config.model_config.get_num_experts_per_tok()
        self.device = next(model.parameters()).device
        parallel = vllm_config.parallel_config
        sequence_parallel = any(r.moe_config.is_sequence_parallel for r in runners)
        self.layout = CaptureLayout(
            parallel.data_parallel_rank,
            parallel.tensor_parallel_size if sequence_parallel else 1,
        )
        # Sized once for the largest pass, so compiled graphs keep one buffer.
        scheduler = vllm_config.scheduler_config
        max_tokens = max(scheduler.max_num_batched_tokens, scheduler.max_num_seqs)
        self.pass_ids = self._buffer(
            parallel.data_parallel_size
            * self.layout.tp_size
            * -(-max_tokens // self.layout.tp_size)
        )
        for runner in runners:
            runner.router.set_capture_fn(
                functools.partial(self._capture, runner.layer_id)
            )
        self.connector: AuxOutputWorkerConnector | None = None
        self.batch: StepBatch | None = None
        self.step_ids = self._buffer(0)

    def start(self, kv_cache_config: KVCacheConfig) -> None:
        """vLLM's connector, once the KV cache config is known, bound to the sinks."""
        self.connector = AuxOutputWorkerConnector(
            vllm_config=self.vllm_config,
            model=self.sinks,
            kv_cache_config=kv_cache_config,
        )

    def _capture(self, layer_id: int, topk_ids: torch.Tensor) -> None:
        """In the forward pass: one MoE layer's logical expert ids."""
        self.pass_ids[: topk_ids.shape[0], layer_id] = topk_ids

    def begin_step(self, scheduler_output: SchedulerOutput) -> None:
        """After the request states took the step: its rows."""
        if self.connector is None:  # profiling, before the caches exist
            return
        self.connector.begin_step(scheduler_output.aux_output_connector_metadata)
        self.batch = StepBatch(scheduler_output, self.input_batch)
        num_rows = int(self.batch.query_start_loc_np[-1])
        self.step_ids = self._buffer(num_rows)

    def before_pass(self, forward_pass: ForwardPass) -> None:
        """A buffer for the pass's routing: every rank's gathered tokens."""
        num_rows = self.layout.captured_rows(forward_pass)
        if self.pass_ids.shape[0] < num_rows:  # a bucket past the warmed ones
            self.pass_ids = self._buffer(num_rows)

    def after_pass(self, forward_pass: ForwardPass) -> None:
        """Device work after the pass: its real tokens' rows into the step's."""
        if self.batch is None:
            return
        rows = self.layout.own_rows(forward_pass)
        for seq, first in zip(
            forward_pass.seqs, forward_pass.first_token_indices, strict=True
        ):
            start = self.batch.offsets[seq.row] + seq.start
            count = seq.layout.num_scheduled_tokens
            src = rows[first : first + count]
            self.step_ids[start : start + count] = self.pass_ids[src]

    def _buffer(self, num_rows: int) -> torch.Tensor:
        shape = (num_rows, self.num_layers, self.top_k)
        return torch.zeros(shape, dtype=torch.int32, device=self.device)

    def step_output(
        self, passes: Future[Any], discard_rows: list[int]
    ) -> dict[str, Any]:
        """Once the step's ``passes`` are done: each request's new rows of
        routed experts (vLLM's ``AuxRequestOutput``), by request id."""
        passes.result()
        if self.connector is None or self.batch is None:
            return {}
        batch, self.batch = self.batch, None
        with set_forward_context(None, self.vllm_config):
            for sink in cast(list[_LayerSink], list(self.sinks)):
                sink.capture_fn(self.step_ids[:, sink.layer_id])
        aux = self.connector.prepare_output(batch)  # type: ignore[arg-type]
        if aux is None:
            return {}
        discarded = set(discard_rows)
        sampled = [0 if r in discarded else 1 for r in batch.rows]
        num_sampled = np.array(sampled, dtype=np.int64)
        aux.enqueue_cpu_copy(num_sampled, np.zeros_like(num_sampled))
        return aux.process_output()


@dataclass(frozen=True)
class CaptureLayout:
    """Where a pass's tokens sit among a MoE layer's rows: the pass; with DP every
    rank's padded pass in turn; with sequence-parallel experts each ceil(n / tp)."""

    dp_rank: int
    tp_size: int  # > 1 where the experts are sequence-parallel

    def _shares(self, forward_pass: ForwardPass) -> torch.Tensor | None:
        across = forward_pass.num_tokens_across_dp
        if across is None:
            return None
        return (across + self.tp_size - 1) // self.tp_size

    def captured_rows(self, forward_pass: ForwardPass) -> int:
        shares = self._shares(forward_pass)
        if shares is None:
            return forward_pass.num_tokens
        return len(shares) * self.tp_size * int(shares.max())

    def own_rows(self, forward_pass: ForwardPass) -> torch.Tensor:
        shares = self._shares(forward_pass)
        if shares is None:
            return torch.arange(forward_pass.num_tokens)
        share, block = int(shares[self.dp_rank]), int(shares.max())
        first = self.dp_rank * self.tp_size
        rows = [torch.arange(share) + (first + t) * block for t in range(self.tp_size)]
        return torch.cat(rows)[: forward_pass.num_tokens]
