"""Async scheduling: step N's sampled tokens feed step N+1 on the device.

Under vLLM's async scheduling the scheduler plans step N+1 before step N's tokens
reach the host, so the runner keeps them on the device (``InFlightTokens``), puts
them into the next decode pass's input ids there, and records them on the host
later, before anything on the host reads them (sampling, resumed prompts).
"""

from dataclasses import dataclass

import torch
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import AsyncModelRunnerOutput, LogprobsTensors, ModelRunnerOutput
from vllm.v1.worker.gpu_input_batch import InputBatch

from vllm_hpu.worker.inputs import ForwardPass
from vllm_hpu.worker.request_states import RequestStates


@dataclass
class InFlightTokens:
    """One step's sampled tokens, not yet recorded on the host."""

    sampled_token_ids: torch.Tensor  # [num_reqs, 1], on the device
    req_id_to_index: dict[str, int]  # rows that sampled (prompt chunks left out)


class HpuAsyncOutput(AsyncModelRunnerOutput):
    """A step's output whose host copy of the sampled tokens is taken on demand."""

    def __init__(
        self,
        output: ModelRunnerOutput,
        sampled_token_ids: torch.Tensor,
        logprobs: LogprobsTensors | None,
        discard_rows: list[int],
    ):
        self._output = output
        self._sampled_token_ids = sampled_token_ids
        self._logprobs = logprobs
        self._discard_rows = discard_rows

    def get_output(self) -> ModelRunnerOutput:
        sampled: list[list[int]] = self._sampled_token_ids.tolist()
        for row in self._discard_rows:
            sampled[row].clear()
        self._output.sampled_token_ids = sampled
        if self._logprobs is not None:
            self._output.logprobs = self._logprobs.tolists()
        return self._output


class AsyncTokenFeed:
    """The runner's side of async scheduling: tokens in flight, fed and recorded."""

    def __init__(self, input_batch: InputBatch, states: RequestStates):
        self.input_batch = input_batch
        self.states = states
        self.in_flight: InFlightTokens | None = None

    def needs_host_tokens_now(self, scheduler_output: SchedulerOutput) -> bool:
        """Whether tokens in flight must reach the host before the batch changes:
        a request leaving it and coming back is rebuilt from its host tokens."""
        if self.in_flight is None:
            return False
        pending = self.in_flight.req_id_to_index.keys()
        resumed = scheduler_output.scheduled_cached_reqs.resumed_req_ids
        leaving = (
            pending
            - scheduler_output.num_scheduled_tokens.keys()
            - scheduler_output.finished_req_ids
        )
        return bool(leaving or pending & resumed)

    def feed(self, forward_pass: ForwardPass) -> None:
        """Put the in-flight tokens into a decode pass's input ids, on the device.
        A decode seq reads one: its token at ``start`` is not on the host yet."""
        if self.in_flight is None or forward_pass.is_prompt:
            return
        batch = self.input_batch
        dst, src = [], []
        for i, seq in enumerate(forward_pass.seqs):
            if seq.start < batch.num_tokens_no_spec[seq.row]:
                continue  # its last token is already on the host
            req_id = batch.req_ids[seq.row]
            assert req_id is not None
            dst.append(i)
            src.append(self.in_flight.req_id_to_index[req_id])
        if dst:
            device = forward_pass.input_ids.device
            tokens = self.in_flight.sampled_token_ids[
                torch.tensor(src, device=device), 0
            ]
            input_ids = forward_pass.input_ids
            input_ids[torch.tensor(dst, device=device)] = tokens.to(input_ids.dtype)

    def record_on_host(self) -> None:
        """Append the in-flight tokens to their requests (this waits for them)."""
        in_flight, self.in_flight = self.in_flight, None
        if in_flight is None:
            return
        tokens = in_flight.sampled_token_ids[:, 0].tolist()
        batch = self.input_batch
        for req_id, index in in_flight.req_id_to_index.items():
            state = self.states.requests.get(req_id)
            if state is None:
                continue  # finished meanwhile
            row = batch.req_id_to_index.get(req_id)
            if row is None:
                state.output_token_ids.append(tokens[index])
            else:
                self.states.append_sampled(row, tokens[index])

    def launch(
        self,
        output: ModelRunnerOutput,
        sampled_token_ids: torch.Tensor,
        logprobs: LogprobsTensors | None,
        discard_rows: list[int],
    ) -> HpuAsyncOutput:
        """Keep this step's tokens in flight; hand back its output to complete."""
        discard = set(discard_rows)
        self.in_flight = InFlightTokens(
            sampled_token_ids=sampled_token_ids,
            req_id_to_index={
                req_id: row
                for req_id, row in output.req_id_to_index.items()
                if row not in discard
            },
        )
        return HpuAsyncOutput(output, sampled_token_ids, logprobs, discard_rows)
