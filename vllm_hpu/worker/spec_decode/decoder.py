"""Speculative decoding in the HPU runner: a request's last token and its drafts
run as one prompt chunk over its KV context, the rejection sampler verifies the
drafts, and a proposer drafts the next step's tokens: vLLM's n-gram proposer,
or a draft model (``worker/draft_model.py``)."""

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from vllm.config import VllmConfig
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import DraftTokenIds, LogprobsLists
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

from vllm_hpu.worker.passes.build import ForwardPass
from vllm_hpu.worker.spec_decode.rejection_sampler import HpuRejectionSampler
from vllm_hpu.worker.warmup.execution import CompileOptions, ExecutionMode

if TYPE_CHECKING:
    from vllm_hpu.worker.model_runner import HpuModelRunner

# Proposers the HPU runner drafts with; the others are refused at start-up.
SUPPORTED_METHODS = ("ngram", "draft_model", "eagle", "eagle3")
# What a refused method needs on the HPU runner, where it is known.
MISSING = {
    "mtp": (
        " (the target's own multi-token-prediction layers drafting as an "
        "EAGLE-style head, which the HPU proposers do not load)"
    ),
}


def check_speculative_config(vllm_config: VllmConfig) -> None:
    """Refuse at start-up what the HPU runner cannot speculate with."""
    spec = vllm_config.speculative_config
    if spec is None:
        return
    if spec.method not in SUPPORTED_METHODS:
        raise ValueError(
            f"The HPU plugin does not support the '{spec.method}' speculative "
            f"decoding method yet{MISSING.get(str(spec.method), '')}; use one of "
            f"{list(SUPPORTED_METHODS)} in --speculative-config, or start vLLM "
            "without it."
        )
    if spec.method in ("draft_model", "eagle", "eagle3"):
        _check_draft_options(spec)
        _check_draft_target(vllm_config)
    if vllm_config.parallel_config.pipeline_parallel_size > 1:
        raise ValueError(
            "The HPU plugin does not support speculative decoding with pipeline "
            "parallelism; drop --speculative-config or --pipeline-parallel-size."
        )


def _check_draft_options(spec: Any) -> None:
    """Draft-model and EAGLE options the HPU proposers do not implement."""
    unsupported = {
        "draft_sample_method 'probabilistic' (drafts are greedy here)": (
            spec.draft_sample_method != "greedy"
        ),
        "use_heterogeneous_vocab (the draft must share the target's vocabulary)": (
            spec.use_heterogeneous_vocab
        ),
        "parallel_drafting": spec.parallel_drafting,
    }
    for option, setting in unsupported.items():
        if setting:
            raise ValueError(
                f"The HPU plugin's {spec.method} proposer does not support {option}; "
                "drop it from --speculative-config."
            )


def _check_draft_target(vllm_config: VllmConfig) -> None:
    """Targets the draft-model and EAGLE proposers do not run beside yet."""
    spec = vllm_config.speculative_config
    assert spec is not None
    model_config = vllm_config.model_config
    draft_tp = getattr(spec.draft_parallel_config, "tensor_parallel_size", 1)
    unsupported = {
        # The draft would read the target's LoRA logits state.
        "LoRA adapters (--enable-lora)": vllm_config.lora_config is not None,
        # The draft would read image placeholders without their embeddings.
        "a multimodal target": model_config is not None
        and model_config.is_multimodal_model,
        # Each rank would hold a whole draft beside its shard (vLLM's rule).
        "a draft_tensor_parallel_size other than --tensor-parallel-size": (
            draft_tp != vllm_config.parallel_config.tensor_parallel_size
        ),
    }
    for feature, setting in unsupported.items():
        if setting:
            raise ValueError(
                f"The HPU plugin's {spec.method} proposer does not run with "
                f"{feature} yet; drop one of them."
            )


def sampled_token_indices(
    forward_pass: ForwardPass, num_sampled: np.ndarray, cu_num_sampled: np.ndarray
) -> tuple[list[int], list[int]]:
    """(rows of the step's logits, flat indices in the pass) of the positions
    to sample: each request's last ``num_sampled[row]`` scheduled tokens."""
    dst: list[int] = []
    src: list[int] = []
    for seq, last in zip(
        forward_pass.seqs, forward_pass.last_token_indices, strict=True
    ):
        count = int(num_sampled[seq.row])
        end = int(cu_num_sampled[seq.row])
        dst.extend(range(end - count, end))
        src.extend(range(last - count + 1, last + 1))
    return dst, src


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


class Proposer(Protocol):
    def load_model(self) -> None: ...

    def prepare(self, mode: ExecutionMode, options: CompileOptions | None) -> None: ...

    def after_target_pass(self, forward_pass: ForwardPass, hidden: Any) -> Any:
        """Returns the target's hidden states (unwrapped where the target
        returns more for the proposer)."""

    def propose(self, num_drafts: int, sampled: list[list[int]]) -> list[list[int]]: ...


class NgramDrafts:
    """vLLM's NgramProposer (numba, CPU) behind the proposer seams: it drafts
    from the tokens so far, with no model of its own."""

    def __init__(self, vllm_config: VllmConfig, input_batch: InputBatch):
        # Imported here: the n-gram proposer compiles its numba kernel on import.
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer

        self.input_batch = input_batch
        self.proposer = NgramProposer(vllm_config)

    def load_model(self) -> None:
        pass

    def prepare(self, mode: ExecutionMode, options: CompileOptions | None) -> None:
        pass

    def after_target_pass(self, forward_pass: ForwardPass, hidden: Any) -> Any:
        return hidden

    def propose(self, num_drafts: int, sampled: list[list[int]]) -> list[list[int]]:
        batch = self.input_batch
        return self.proposer.propose(
            num_drafts, sampled, batch.num_tokens_no_spec, batch.token_ids_cpu
        )


def make_proposer(runner: "HpuModelRunner") -> Proposer:
    spec = runner.vllm_config.speculative_config
    assert spec is not None and spec.method in SUPPORTED_METHODS
    if spec.method == "draft_model":
        from vllm_hpu.worker.spec_decode.draft_model import HpuDraftModelProposer

        return HpuDraftModelProposer(runner)
    if spec.method == "eagle":
        from vllm_hpu.worker.spec_decode.eagle import HpuEagleProposer

        return HpuEagleProposer(runner)
    if spec.method == "eagle3":
        from vllm_hpu.worker.spec_decode.eagle import HpuEagle3Proposer

        return HpuEagle3Proposer(runner)
    return NgramDrafts(runner.vllm_config, runner.input_batch)


class SpecDecoder:
    """Per step: write the scheduled drafts into the batch, lay out the
    positions to sample, verify them, and propose the next drafts."""

    def __init__(self, runner: "HpuModelRunner"):
        spec = runner.vllm_config.speculative_config
        assert spec is not None
        self.input_batch = runner.input_batch
        self.proposer = make_proposer(runner)
        self.rejection_sampler = HpuRejectionSampler(runner.sampler, spec)
        self._drafts: DraftTokenIds | None = None

    @property
    def has_draft_model(self) -> bool:
        return not isinstance(self.proposer, NgramDrafts)

    def update(
        self,
        scheduler_output: SchedulerOutput,
        requests: Mapping[str, CachedRequestState],
    ) -> None:
        """Put each row's scheduled drafts after its tokens, where the pass
        reads its input ids; a row without drafts gets none."""
        scheduled = scheduler_output.scheduled_spec_decode_tokens
        for req_id in self.input_batch.req_ids:
            self.input_batch.update_req_spec_token_ids(requests[req_id], scheduled)

    def num_draft_tokens(self) -> np.ndarray:
        rows = self.input_batch.spec_token_ids[: self.input_batch.num_reqs]
        return np.array([len(drafts) for drafts in rows], dtype=np.int64)

    def metadata(self, device: torch.device) -> SpecDecodeMetadata | None:
        """None when no row has drafts this step."""
        rows = self.input_batch.spec_token_ids[: self.input_batch.num_reqs]
        return spec_decode_metadata(rows, device) if any(rows) else None

    def sample(
        self,
        metadata: SpecDecodeMetadata,
        logits: torch.Tensor,
        sampling_metadata: SamplingMetadata,
        discard_rows: list[int],
    ) -> tuple[list[list[int]], LogprobsLists | None]:
        """Each row's accepted drafts plus one token (none for discarded rows)."""
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
        """Draft from the tokens so far (accepted ones included); rows that
        sampled nothing (inside a prompt) get no drafts."""
        drafts = self.proposer.propose(
            scheduler_output.num_spec_tokens_to_schedule, sampled
        )
        self._drafts = DraftTokenIds(list(self.input_batch.req_ids), drafts)

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        drafts, self._drafts = self._drafts, None
        return drafts
