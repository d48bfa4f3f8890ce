"""Pooling models (``--runner pooling``): vLLM's pooler wants a step's tokens
packed in batch-row order; our passes are padded, so real tokens are gathered."""

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from vllm.config import ModelConfig, VllmConfig
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.model_executor.models.interfaces_base import is_pooling_model
from vllm.tasks import PoolingTask
from vllm.v1.attention.backend import AttentionType
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.worker.gpu_input_batch import InputBatch

from vllm_hpu.worker.passes.forward_pass import ForwardPass


def encoder_only_kv_cache_spec(
    layer: AttentionLayerBase, vllm_config: VllmConfig
) -> FullAttentionSpec | None:
    """A decoder's cache spec for an encoder-only layer (vLLM gives it none): one
    step path (block tables, buckets, warmup) at the price of unused KV memory."""
    if getattr(layer, "attn_type", None) != AttentionType.ENCODER_ONLY:
        return None
    assert isinstance(layer, Attention)
    if vllm_config.model_config.runner_type != "pooling":
        raise ValueError(
            f"Layer {layer.layer_name} attends bidirectionally (encoder-only), "
            "which cannot generate text: start vLLM with --runner pooling."
        )
    return FullAttentionSpec(
        block_size=vllm_config.cache_config.block_size,
        num_kv_heads=layer.num_kv_heads,
        head_size=layer.head_size,
        dtype=layer.kv_cache_torch_dtype,
    )


def supported_pooling_tasks(model: Any) -> list[PoolingTask]:
    """What the loaded model's pooler can do (embed, classify, ...)."""
    if not is_pooling_model(model):
        return []
    return list(model.pooler.get_supported_tasks())


class Pooling:
    """What the runner asks of a pooler; a generating model's never pools."""

    def prepare_new_requests(self, scheduler_output: SchedulerOutput) -> None:
        pass

    def pool(
        self,
        scheduler_output: SchedulerOutput,
        hidden_states: Iterable[tuple[ForwardPass, torch.Tensor]],
    ) -> ModelRunnerOutput:
        raise AssertionError("a generating model samples its passes' logits")


class StepPooler(Pooling):
    """Packs one step's hidden states, pass by pass, and pools them at the end."""

    def __init__(
        self, input_batch: InputBatch, model: Any, model_config: ModelConfig
    ) -> None:
        self.input_batch = input_batch
        self.model = model
        self.hidden_size = model_config.get_hidden_size()
        dtype = model_config.dtype
        assert isinstance(dtype, torch.dtype), "vLLM resolves the dtype first"
        self.dtype = dtype
        self._packed: torch.Tensor | None = None
        self._offsets: np.ndarray = np.zeros(0, dtype=np.int64)
        self._num_scheduled: np.ndarray = np.zeros(0, dtype=np.int64)

    def prepare_new_requests(self, scheduler_output: SchedulerOutput) -> None:
        """The pooler adjusts each new request's parameters, as on vLLM's GPU runner."""
        for new_req in scheduler_output.scheduled_new_reqs:
            params = new_req.pooling_params
            if params is None or params.task is None:
                raise ValueError(
                    f"Request {new_req.req_id} reached a pooling model without a "
                    "pooling task: use LLM.embed / LLM.classify or /v1/embeddings."
                )
            self.model.pooler.get_pooling_updates(params.task).apply(params)

    def pool(
        self,
        scheduler_output: SchedulerOutput,
        hidden_states: Iterable[tuple[ForwardPass, torch.Tensor]],
    ) -> ModelRunnerOutput:
        """Pool a step from its passes' hidden states, taken one pass at a time."""
        self._begin(scheduler_output)
        for forward_pass, hidden in hidden_states:
            self._collect(forward_pass, hidden)
        return self._finish()

    def _begin(self, scheduler_output: SchedulerOutput) -> None:
        """Room for every scheduled token of the step, rows in InputBatch order."""
        req_ids = self.input_batch.req_ids
        counts = [scheduler_output.num_scheduled_tokens[r] for r in req_ids]
        self._num_scheduled = np.array(counts, dtype=np.int64)
        self._offsets = np.concatenate(([0], np.cumsum(self._num_scheduled)[:-1]))
        self._packed = torch.empty(
            (int(self._num_scheduled.sum()), self.hidden_size),
            dtype=self.dtype,
            device=self.input_batch.device,
        )

    def _collect(self, forward_pass: ForwardPass, hidden: torch.Tensor) -> None:
        """Copy the real tokens of one padded pass into the packed tensor."""
        assert self._packed is not None, "_begin() first"
        sources, targets = [], []
        for first, seq in zip(
            forward_pass.first_token_indices, forward_pass.seqs, strict=True
        ):
            count = seq.layout.num_scheduled_tokens
            sources.append(np.arange(first, first + count))
            targets.append(np.arange(count) + self._offsets[seq.row])
        device = hidden.device
        self._packed[torch.from_numpy(np.concatenate(targets)).to(device)] = (
            hidden.index_select(0, torch.from_numpy(np.concatenate(sources)).to(device))
        )

    def _finish(self) -> ModelRunnerOutput:
        """Run the pooler; a request whose prompt is not complete yet gets None."""
        packed, self._packed = self._packed, None
        assert packed is not None, "_begin() first"
        batch = self.input_batch
        num_reqs = batch.num_reqs
        metadata = batch.get_pooling_metadata()
        seq_lens = batch.num_computed_tokens_cpu[:num_reqs] + self._num_scheduled
        metadata.build_pooling_cursor(
            self._num_scheduled, torch.from_numpy(seq_lens), device=packed.device
        )
        pooled = self.model.pooler(hidden_states=packed, pooling_metadata=metadata)
        finished = metadata.get_pooling_cursor().get_finished_mask()
        return ModelRunnerOutput(
            req_ids=list(batch.req_ids),
            req_id_to_index=dict(batch.req_id_to_index),
            pooler_output=[
                output.cpu() if done and output is not None else None
                for output, done in zip(pooled, finished, strict=True)
            ],
        )
