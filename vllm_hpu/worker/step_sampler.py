"""A step's sampling, after its forward passes: the grammar mask, then each row's
token (vLLM's sampler) or its accepted drafts plus one (speculative decoding),
and the output the scheduler reads."""

from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
from vllm.v1.structured_output.utils import apply_grammar_bitmask

from vllm_hpu.worker.state.async_output import (
    SampledStep,
    StepLogits,
    keeping_generators,
)
from vllm_hpu.worker.state.request_states import RequestStates

if TYPE_CHECKING:
    from vllm_hpu.worker.capabilities.factory import Capabilities


@dataclass
class PendingStep:
    """What execute_model hands to sample_tokens."""

    scheduler_output: SchedulerOutput
    # The passes on the device stream; logits [num_sampled, vocab_size]: per
    # row in InputBatch order, its draft positions (speculative decoding)
    # then its last token.
    device: "Future[StepLogits]"
    discard_rows: list[int]  # rows inside a prompt: their sample is dropped
    spec_metadata: SpecDecodeMetadata | None  # None: one token per row


class StepSampler:
    def __init__(self, states: RequestStates, caps: "Capabilities") -> None:
        self.states = states
        self.input_batch = states.input_batch
        self.caps = caps

    def sample(
        self,
        pending: PendingStep,
        grammar_output: GrammarOutput | None,
        sampling_metadata: SamplingMetadata,
    ) -> SampledStep:
        """Device work, after the step's passes: the grammar mask, then each
        row's token, or its accepted drafts plus one."""
        step = pending.device.result()  # done: it was queued before
        if grammar_output is not None:
            apply_grammar_bitmask(
                pending.scheduler_output,
                grammar_output,
                self.input_batch,
                step.logits,
            )
        generators = self.input_batch.generators
        with (
            self.caps.profiler.span("sample"),
            keeping_generators(generators, pending.discard_rows),
        ):
            sampled, logprobs = self.caps.spec.sample(
                pending.spec_metadata,
                step.logits,
                sampling_metadata,
                pending.discard_rows,
            )
        return SampledStep(sampled, logprobs, step.prompt_logprobs)

    def output(self, pending: PendingStep, step: SampledStep) -> ModelRunnerOutput:
        """The step's tokens on the host, appended to their requests (and drafts
        proposed from them), as the scheduler reads them."""
        sampled_token_ids, logprobs = step.on_host(pending.discard_rows)
        for row, tokens in enumerate(sampled_token_ids):
            for token_id in tokens:
                self.states.append_sampled(row, token_id)
        self.caps.spec.propose(pending.scheduler_output, sampled_token_ids)
        return ModelRunnerOutput(
            req_ids=list(self.input_batch.req_ids),
            req_id_to_index=dict(self.input_batch.req_id_to_index),
            sampled_token_ids=sampled_token_ids,
            logprobs=logprobs,
            prompt_logprobs_dict=step.prompt_logprobs,
            kv_connector_output=self.caps.kv_connector.take_output(),
        )
