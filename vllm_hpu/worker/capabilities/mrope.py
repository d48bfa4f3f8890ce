"""M-RoPE positions (Qwen2-VL): positions of shape ``[3, num_tokens]`` (time,
height, width). A prompt token's come from the model's
``get_mrope_input_positions`` (once per request, as vLLM's GPU runner does); a
later token sits at ``position + mrope_position_delta`` in all three rows."""

from typing import Any

import numpy as np
import torch
from vllm.model_executor.models.interfaces import SupportsMRoPE
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

from vllm_hpu.worker.passes.forward_pass import ForwardPass
from vllm_hpu.worker.passes.seqs import ScheduledSeq


class FlatPositions:
    """A pass's positions as planned, ``[num_tokens]``: a model without M-RoPE."""

    def positions(self, forward_pass: ForwardPass) -> torch.Tensor:
        return forward_pass.positions


class MRopePositions(FlatPositions):
    def __init__(
        self,
        model: SupportsMRoPE,
        num_dims: int,
        input_batch: InputBatch,
        requests: dict[str, CachedRequestState],
    ):
        self.model = model
        self.num_dims = num_dims
        self.input_batch = input_batch
        self.requests = requests

    def positions(self, forward_pass: ForwardPass) -> torch.Tensor:
        """The pass's positions, ``[num_dims, num_tokens]``, on its device."""
        out = np.zeros((self.num_dims, forward_pass.num_tokens), dtype=np.int64)
        for first, seq in zip(
            forward_pass.first_token_indices, forward_pass.seqs, strict=True
        ):
            end = first + seq.layout.num_scheduled_tokens
            out[:, first:end] = self.seq_positions(seq)
        return torch.from_numpy(out).to(forward_pass.positions.device)

    def seq_positions(self, seq: ScheduledSeq) -> np.ndarray:
        """``[num_dims, scheduled tokens]`` for one scheduled chunk."""
        flat = np.arange(seq.start, seq.end)
        # profile_run's rows belong to no request: plain positions.
        if seq.row >= self.input_batch.num_reqs:
            return np.broadcast_to(flat, (self.num_dims, len(flat)))
        prompt, delta = self._request_positions(self.input_batch.req_ids[seq.row])
        in_prompt = flat < prompt.shape[1]
        clipped = np.minimum(flat, prompt.shape[1] - 1)
        return np.where(in_prompt, prompt[:, clipped], flat + delta)

    def _request_positions(self, req_id: str) -> tuple[np.ndarray, int]:
        """The prompt's positions and the later tokens' delta, on the first pass."""
        state = self.requests[req_id]
        if state.mrope_positions is None:
            # A prompt given as embeddings is all text: its length is enough.
            tokens = state.prompt_token_ids or list(range(state.num_prompt_tokens))
            state.mrope_positions, state.mrope_position_delta = (
                self.model.get_mrope_input_positions(tokens, state.mm_features)
            )
        assert state.mrope_position_delta is not None
        return state.mrope_positions.numpy(), state.mrope_position_delta


def mrope_positions_for(
    model: Any,
    model_config: Any,
    input_batch: InputBatch,
    requests: dict[str, CachedRequestState],
) -> FlatPositions:
    """The M-RoPE position builder of a model that uses M-RoPE."""
    if not model_config.uses_mrope:
        return FlatPositions()
    return MRopePositions(model, model_config.mrope_num_dims, input_batch, requests)
