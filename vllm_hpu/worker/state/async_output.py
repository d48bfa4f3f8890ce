"""Async scheduling: step N's sampled tokens feed step N+1 on the device. The
scheduler plans N+1 before N's tokens reach the host, so the runner keeps them
on the device (``InFlightTokens``), writes them into the next decode's input
ids, and records them on the host before the host reads them. Device work runs
on the device stream while the host prepares. Ownership meanwhile:
- a step's input tensors are fresh per step: the host never writes them again;
- the KV cache and the weights: only queued work touches them;
- the InputBatch: the host's, but queued sampling reads it, so the host waits
  for the stream before changing the batch (``before_update``);
- sampled tokens: the stream's, read by the host only through the future."""

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import (
    AsyncModelRunnerOutput,
    KVConnectorOutput,
    LogprobsLists,
    LogprobsTensors,
    ModelRunnerOutput,
)
from vllm.v1.sample.logits_processor.builtin import MinTokensLogitsProcessor
from vllm.v1.worker.gpu_input_batch import InputBatch

from vllm_hpu.emulation.device_stream import DeviceStream
from vllm_hpu.worker.passes.forward_pass import ForwardPass
from vllm_hpu.worker.state.request_states import RequestStates


@dataclass
class StepLogits:
    """A step's logits to sample and the prompt logprobs it completed."""

    logits: torch.Tensor  # [num_sampled, vocab_size]
    prompt_logprobs: dict[str, LogprobsTensors | None]


@dataclass
class SampledStep:
    """A step's samples: on the device ([num_reqs, 1] and tensors), or per row
    on the host already (speculative decoding's accepted tokens)."""

    sampled_token_ids: torch.Tensor | list[list[int]]
    logprobs: LogprobsTensors | LogprobsLists | None
    prompt_logprobs: dict[str, LogprobsTensors | None]

    def on_host(
        self, discard_rows: list[int]
    ) -> tuple[list[list[int]], LogprobsLists | None]:
        """Tokens per row (none for ``discard_rows``) and logprobs, as lists."""
        sampled = self.sampled_token_ids
        if isinstance(sampled, torch.Tensor):
            sampled = sampled.tolist()
        for row in discard_rows:
            sampled[row].clear()
        logprobs = self.logprobs
        if isinstance(logprobs, LogprobsTensors):
            logprobs = logprobs.tolists()
        return sampled, logprobs


@contextmanager
def keeping_generators(
    generators: dict[int, torch.Generator], rows: list[int]
) -> Iterator[None]:
    """Sampling inside leaves the seeded generators of ``rows`` as they were:
    a discarded sample must not advance its request's generator."""
    saved = {row: generators[row].get_state() for row in rows if row in generators}
    yield
    for row, state in saved.items():
        generators[row].set_state(state)


@dataclass
class InFlightTokens:
    """One step's sampled tokens, not yet recorded on the host."""

    sampled: "Future[SampledStep]"  # sampled_token_ids [num_reqs, 1], on the device
    req_id_to_index: dict[str, int]  # rows that sampled (prompt chunks left out)


class HpuAsyncOutput(AsyncModelRunnerOutput):
    """A step's output whose host copy of the samples is taken on demand."""

    def __init__(
        self,
        output: ModelRunnerOutput,
        sampled: "Future[SampledStep]",
        discard_rows: list[int],
    ):
        self._output = output
        self._sampled = sampled
        self._discard_rows = discard_rows

    def get_output(self) -> ModelRunnerOutput:
        step = self._sampled.result()  # waits for the stream
        output = self._output
        output.sampled_token_ids, output.logprobs = step.on_host(self._discard_rows)
        output.prompt_logprobs_dict = step.prompt_logprobs
        return output

    def get_kv_connector_output(self) -> KVConnectorOutput | None:
        """The step's KV connector output, known before its samples: vLLM 0.33
        keeps it when ``get_output`` fails (abstract there, unused by 0.32)."""
        return self._output.kv_connector_output


def _put_tokens(
    input_ids: torch.Tensor,
    dst: torch.Tensor,
    src: torch.Tensor,
    sampled: "Future[SampledStep]",
) -> None:
    """Device work: ``input_ids[dst] = sampled tokens[src]``."""
    tokens = sampled.result().sampled_token_ids  # done: it was queued before
    assert isinstance(tokens, torch.Tensor)
    input_ids[dst] = tokens[src, 0].to(input_ids.dtype)


class TokenFeed:
    """Synchronous scheduling (this class): tokens reach the next step via the host."""

    def before_update(self, scheduler_output: SchedulerOutput) -> None:
        pass

    def feed(self, forward_pass: ForwardPass) -> None:
        pass

    def record_on_host(self) -> None:
        pass

    def finish(
        self,
        sampled: "Future[SampledStep]",
        discard_rows: list[int],
        on_host: Callable[[], ModelRunnerOutput],
        aux_output: dict[str, Any] | None,
    ) -> ModelRunnerOutput | HpuAsyncOutput:
        """The step's output: here ``on_host()``, its tokens on the host, with
        ``aux_output`` (routed experts) where a capability made one."""
        output = on_host()
        output.aux_output_connector_output = aux_output
        return output


class AsyncTokenFeed(TokenFeed):
    """The runner's side of async scheduling: tokens in flight, fed and recorded."""

    def __init__(
        self, input_batch: InputBatch, states: RequestStates, stream: DeviceStream
    ):
        self.input_batch = input_batch
        self.states = states
        self.stream = stream
        self.in_flight: InFlightTokens | None = None

    def before_update(self, scheduler_output: SchedulerOutput) -> None:
        """Before applying a batch-changing step: wait for the stream (queued sampling
        reads the batch) and record tokens in flight (returning requests are rebuilt
        from them). Otherwise wait only while a request counts ``min_tokens``."""
        if self._changes_batch(scheduler_output) or self._counts_min_tokens():
            self.record_on_host()
            self.stream.synchronize()

    def _counts_min_tokens(self) -> bool:
        """vLLM's min-tokens processor counts host tokens and swaps the stop-token mask
        queued sampling reads: while it holds requests, no sampling is in flight."""
        return any(
            isinstance(processor, MinTokensLogitsProcessor) and processor.min_toks
            for processor in self.input_batch.logitsprocs.all
        )

    def _changes_batch(self, scheduler_output: SchedulerOutput) -> bool:
        in_batch = self.input_batch.req_id_to_index.keys()
        return bool(
            scheduler_output.scheduled_new_reqs
            or scheduler_output.scheduled_cached_reqs.resumed_req_ids
            or in_batch & scheduler_output.finished_req_ids
            or in_batch - scheduler_output.num_scheduled_tokens.keys()
            or scheduler_output.scheduled_encoder_inputs
            or scheduler_output.free_encoder_mm_hashes
        )

    def feed(self, forward_pass: ForwardPass) -> None:
        """Queue the in-flight tokens into a decode pass's input ids. A decode
        seq reads one: its token at ``start`` is not on the host yet."""
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
            self.stream.submit(
                _put_tokens,
                forward_pass.input_ids,
                torch.tensor(dst, device=device),
                torch.tensor(src, device=device),
                self.in_flight.sampled,
            )

    def record_on_host(self) -> None:
        """Append the in-flight tokens to their requests (this waits for them)."""
        in_flight, self.in_flight = self.in_flight, None
        if in_flight is None:
            return
        sampled = in_flight.sampled.result().sampled_token_ids
        assert isinstance(sampled, torch.Tensor)
        tokens = sampled[:, 0].tolist()
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

    def finish(
        self,
        sampled: "Future[SampledStep]",
        discard_rows: list[int],
        on_host: Callable[[], ModelRunnerOutput],
        aux_output: dict[str, Any] | None,
    ) -> HpuAsyncOutput:
        """The sampled tokens stay on the device for the next step; the output's host
        copy completes on demand (never with drafts)."""
        output = ModelRunnerOutput(
            req_ids=list(self.input_batch.req_ids),
            req_id_to_index=dict(self.input_batch.req_id_to_index),
            aux_output_connector_output=aux_output,
        )
        discard = set(discard_rows)
        self.in_flight = InFlightTokens(
            sampled=sampled,
            req_id_to_index={
                req_id: row
                for req_id, row in output.req_id_to_index.items()
                if row not in discard
            },
        )
        return HpuAsyncOutput(output, sampled, discard_rows)
