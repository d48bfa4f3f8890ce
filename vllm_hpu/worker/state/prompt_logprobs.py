"""Prompt logprobs, gathered chunk by chunk as a prompt is prefilled: position
``p`` scores token ``p + 1``; a request's tensors go back after its last chunk."""

from collections.abc import Callable

import torch
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import LogprobsTensors
from vllm.v1.sample.sampler import Sampler

from vllm_hpu.worker.passes.forward_pass import ForwardPass
from vllm_hpu.worker.state.request_states import RequestStates


def _of_row(
    compute_logits: Callable[[torch.Tensor, list[int]], torch.Tensor], row: int
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``compute_logits`` for hidden states that all belong to InputBatch ``row``."""

    def logits(hidden: torch.Tensor) -> torch.Tensor:
        return compute_logits(hidden, [row] * hidden.shape[0])

    return logits


class PromptLogprobs:
    def __init__(self, states: RequestStates):
        self.states = states
        self._in_progress: dict[str, LogprobsTensors] = {}
        self._completed: dict[str, LogprobsTensors | None] = {}

    def collect(
        self,
        forward_pass: ForwardPass,
        hidden: torch.Tensor,
        compute_logits: Callable[[torch.Tensor, list[int]], torch.Tensor],
    ) -> None:
        """Score this pass's prompt positions for requests that ask; ``compute_logits``
        takes InputBatch ``rows`` (a LoRA's LM head tells requests apart)."""
        wanted = self.states.num_prompt_logprobs
        if not wanted:
            return
        req_ids = self.states.input_batch.req_ids
        for first, seq in zip(
            forward_pass.first_token_indices, forward_pass.seqs, strict=True
        ):
            req_id = req_ids[seq.row]
            if req_id in wanted:
                rows = hidden[first : first + seq.layout.num_scheduled_tokens]
                self._score_chunk(
                    req_id, seq.start, rows, _of_row(compute_logits, seq.row)
                )

    def _score_chunk(
        self,
        req_id: str,
        start: int,
        hidden: torch.Tensor,
        compute_logits: Callable[[torch.Tensor], torch.Tensor],
    ) -> None:
        prompt = self.states.requests[req_id].prompt_token_ids
        assert prompt is not None, "prompt logprobs need prompt token ids"
        num_logprobs = self.states.num_prompt_logprobs[req_id]
        tensors = self._in_progress.setdefault(
            req_id, LogprobsTensors.empty_cpu(len(prompt) - 1, num_logprobs + 1)
        )
        num_scored = min(hidden.shape[0], len(prompt) - 1 - start)
        if num_scored > 0:
            targets = torch.tensor(prompt[start + 1 : start + 1 + num_scored])
            scores = Sampler.compute_logprobs(compute_logits(hidden[:num_scored]))
            token_ids, logprobs, ranks, *_ = Sampler.gather_logprobs(
                scores, num_logprobs, targets.to(scores.device)
            )
            chunk = slice(start, start + num_scored)
            tensors.logprob_token_ids[chunk] = token_ids.cpu()
            tensors.logprobs[chunk] = logprobs.cpu()
            tensors.selected_token_ranks[chunk] = ranks.cpu()
        if start + hidden.shape[0] >= len(prompt):
            self._completed[req_id] = self._in_progress.pop(req_id)
            del self.states.num_prompt_logprobs[req_id]

    def finish(
        self, scheduler_output: SchedulerOutput
    ) -> dict[str, LogprobsTensors | None]:
        """Prompt logprobs of the requests whose prompt completed in this step."""
        for req_id in scheduler_output.finished_req_ids:
            self._in_progress.pop(req_id, None)
        completed, self._completed = self._completed, {}
        return completed
