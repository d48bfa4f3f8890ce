"""vLLM's n-gram proposer (prompt lookup) behind the ``Proposer`` seam."""

from vllm.config import VllmConfig
from vllm.v1.worker.gpu_input_batch import InputBatch

from vllm_hpu.worker.spec_decode.interface import Proposer


class NgramDrafts(Proposer):
    """vLLM's NgramProposer (numba, CPU): drafts from the tokens so far."""

    def __init__(self, vllm_config: VllmConfig, input_batch: InputBatch):
        _use_workqueue_threads()
        # Imported here: the n-gram proposer compiles its numba kernel on import.
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer

        self.input_batch = input_batch
        self.proposer = NgramProposer(vllm_config)

    def propose(self, num_drafts: int, sampled: list[list[int]]) -> list[list[int]]:
        batch = self.input_batch
        return self.proposer.propose(
            num_drafts, sampled, batch.num_tokens_no_spec, batch.token_ids_cpu
        )


def _use_workqueue_threads() -> None:
    """numba on its workqueue layer unless NUMBA_THREADING_LAYER is set: its OpenMP
    default made torch's CPU ops 100-2000x slower (n-gram at 1/5 the tokens/s)."""
    import numba

    if numba.config.THREADING_LAYER == "default":
        numba.config.THREADING_LAYER = "workqueue"
