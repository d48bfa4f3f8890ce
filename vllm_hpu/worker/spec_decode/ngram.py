"""vLLM's n-gram proposer (prompt lookup) behind the ``Proposer`` seam."""

from typing import Any

from vllm.config import VllmConfig
from vllm.v1.worker.gpu_input_batch import InputBatch

from vllm_hpu.worker.passes.forward_pass import ForwardPass
from vllm_hpu.worker.warmup.execution import CompileOptions, ExecutionMode


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
