"""Speculative decoding: a request's last token and drafts are one row of a
verification pass (``k + 1`` queries per row, ``passes/build.py``), the
rejection sampler verifies, and a proposer (``ngram.py``, ``draft_model.py``,
``eagle.py``) drafts, reading the runner through ``interface.TargetRunner``."""

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import DraftTokenIds, LogprobsLists, LogprobsTensors
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.sampler import Sampler
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

from vllm_hpu.worker.compilation.execution import CompileOptions, ExecutionMode
from vllm_hpu.worker.passes.forward_pass import ForwardPass
from vllm_hpu.worker.spec_decode.draft_model import HpuDraftModelProposer
from vllm_hpu.worker.spec_decode.eagle import HpuEagle3Proposer, HpuEagleProposer
from vllm_hpu.worker.spec_decode.interface import Proposer, TargetRunner
from vllm_hpu.worker.spec_decode.methods import SUPPORTED_METHODS
from vllm_hpu.worker.spec_decode.ngram import NgramDrafts
from vllm_hpu.worker.spec_decode.rejection_sampler import HpuRejectionSampler


def spec_decode_metadata(
    draft_token_ids: list[list[int]], device: torch.device
) -> SpecDecodeMetadata:
    """Where each row's draft and bonus logits sit in the step's logits: rows
    in batch order, each its draft positions then its bonus position."""
    num_draft = np.array([len(row) for row in draft_token_ids], dtype=np.int64)
    num_sampled = num_draft + 1
    cu_sampled = np.cumsum(num_sampled)
    cu_draft = np.cumsum(num_draft)
    # Draft j of row i: row i's first sampled position, plus j.
    offsets = np.arange(cu_draft[-1]) - np.repeat(cu_draft - num_draft, num_draft)
    target = np.repeat(cu_sampled - num_sampled, num_draft) + offsets

    def tensor(values: np.ndarray | list[int]) -> torch.Tensor:
        return torch.tensor(np.asarray(values), dtype=torch.int32, device=device)

    return SpecDecodeMetadata(
        draft_token_ids=tensor([token for row in draft_token_ids for token in row]),
        num_draft_tokens=num_draft.tolist(),
        cu_num_draft_tokens=tensor(cu_draft),
        cu_num_sampled_tokens=tensor(cu_sampled),
        target_logits_indices=tensor(target),
        bonus_logits_indices=tensor(cu_sampled - 1),
        logits_indices=tensor(np.arange(cu_sampled[-1])),
    )


def make_proposer(runner: TargetRunner) -> Proposer:
    spec = runner.vllm_config.speculative_config
    assert spec is not None and spec.method in SUPPORTED_METHODS
    if spec.method == "draft_model":
        return HpuDraftModelProposer(runner)
    if spec.method in ("eagle", "mtp"):  # MTP layers read the states as EAGLE does
        return HpuEagleProposer(runner)
    if spec.method == "eagle3":
        return HpuEagle3Proposer(runner)
    return NgramDrafts(runner.vllm_config, runner.input_batch)


class SpecDecoding:
    """What the runner asks of speculative decoding; without it (this class)
    no row has drafts: vLLM's sampler samples one token per row."""

    def __init__(self, input_batch: InputBatch, sampler: Sampler):
        self.input_batch = input_batch
        self.sampler = sampler
        self.proposer = Proposer()

    @property
    def has_draft_model(self) -> bool:
        return False

    def load_model(self) -> None:
        """A draft model loads after the target."""
        self.proposer.load_model()

    def prepare(self, mode: ExecutionMode, options: CompileOptions | None) -> None:
        self.proposer.prepare(mode, options)

    def after_target_pass(self, forward_pass: ForwardPass, hidden: Any) -> Any:
        """A draft model writes the pass into its KV cache."""
        return self.proposer.after_target_pass(forward_pass, hidden)

    def update(
        self,
        scheduler_output: SchedulerOutput,
        requests: Mapping[str, CachedRequestState],
    ) -> None:
        pass

    def num_draft_tokens(self) -> np.ndarray:
        return np.zeros(self.input_batch.num_reqs, dtype=np.int64)

    def metadata(self, device: torch.device) -> SpecDecodeMetadata | None:
        """None when no row has drafts this step."""
        return None

    def sample(
        self,
        metadata: SpecDecodeMetadata | None,
        logits: torch.Tensor,
        sampling_metadata: SamplingMetadata,
        discard_rows: list[int],
    ) -> tuple[torch.Tensor | list[list[int]], LogprobsTensors | LogprobsLists | None]:
        """Each row's token (on the device); with drafts (``metadata``) its
        accepted drafts plus one (on the host, none for discarded rows)."""
        output = self.sampler(logits=logits, sampling_metadata=sampling_metadata)
        return output.sampled_token_ids, output.logprobs_tensors

    def propose(
        self, scheduler_output: SchedulerOutput, sampled: list[list[int]]
    ) -> None:
        pass

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        return None


class SpecDecoder(SpecDecoding):
    """Per step: drafts into the batch, verify them, propose the next ones."""

    def __init__(self, runner: TargetRunner, sampler: Sampler):
        super().__init__(runner.input_batch, sampler)
        spec = runner.vllm_config.speculative_config
        assert spec is not None
        self.proposer = make_proposer(runner)
        self.rejection_sampler = HpuRejectionSampler(sampler, spec)
        self._drafts: DraftTokenIds | None = None

    @property
    def has_draft_model(self) -> bool:
        return not isinstance(self.proposer, NgramDrafts)

    def update(
        self,
        scheduler_output: SchedulerOutput,
        requests: Mapping[str, CachedRequestState],
    ) -> None:
        """Put each row's scheduled drafts after its tokens (none: none)."""
        scheduled = scheduler_output.scheduled_spec_decode_tokens
        for req_id in self.input_batch.req_ids:
            self.input_batch.update_req_spec_token_ids(requests[req_id], scheduled)

    def num_draft_tokens(self) -> np.ndarray:
        rows = self.input_batch.spec_token_ids[: self.input_batch.num_reqs]
        return np.array([len(drafts) for drafts in rows], dtype=np.int64)

    def metadata(self, device: torch.device) -> SpecDecodeMetadata | None:
        rows = self.input_batch.spec_token_ids[: self.input_batch.num_reqs]
        return spec_decode_metadata(rows, device) if any(rows) else None

    def sample(
        self,
        metadata: SpecDecodeMetadata | None,
        logits: torch.Tensor,
        sampling_metadata: SamplingMetadata,
        discard_rows: list[int],
    ) -> tuple[torch.Tensor | list[list[int]], LogprobsTensors | LogprobsLists | None]:
        if metadata is None:
            return super().sample(metadata, logits, sampling_metadata, discard_rows)
        output = self.rejection_sampler(metadata, None, logits, sampling_metadata)
        return self.rejection_sampler.parse_output(
            output.sampled_token_ids,
            self.input_batch.vocab_size,
            discard_rows,
            output.logprobs_tensors,
        )

    def propose(
        self, scheduler_output: SchedulerOutput, sampled: list[list[int]]
    ) -> None:
        """Draft from the tokens so far; rows that sampled nothing get none."""
        drafts = self.proposer.propose(
            scheduler_output.num_spec_tokens_to_schedule, sampled
        )
        self._drafts = DraftTokenIds(list(self.input_batch.req_ids), drafts)

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        drafts, self._drafts = self._drafts, None
        return drafts
