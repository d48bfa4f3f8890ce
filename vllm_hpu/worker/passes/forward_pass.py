"""What planning produces: one padded forward pass, its bucket, its rows and
their attention metadata, plus where each row's tokens sit in it."""

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from vllm_hpu.attention.metadata import HpuAttentionMetadata
from vllm_hpu.attention.state_metadata import HpuStateMetadata, StateCheckpointCopies
from vllm_hpu.bucketing import Bucket
from vllm_hpu.worker.passes.seqs import ScheduledSeq


@dataclass
class ForwardPass:
    is_prompt: bool
    bucket: Bucket
    seqs: list[ScheduledSeq]
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    # One per KV cache group (vLLM's hybrid KV cache manager), in the order of
    # the requests' block tables; one for every layer otherwise.
    group_metadata: tuple[HpuAttentionMetadata, ...]
    first_token_indices: list[int]  # flat index of each seq's first scheduled token
    # Data parallel MoE: [dp_size] num_tokens of the pass each rank runs with
    # this one (worker/capabilities/data_parallel.py); None: vLLM asks the ranks.
    num_tokens_across_dp: torch.Tensor | None = None
    # A hybrid model's state layers: each row's state slot (set after planning
    # by worker/capabilities/state_cache.py); None for other models.
    state_metadata: HpuStateMetadata | None = None
    # Prefix caching (Mamba "align"): the state copies around the pass, or None.
    state_checkpoints: StateCheckpointCopies | None = None

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_real_tokens(self) -> int:
        """The scheduled tokens in the pass; the rest is padding."""
        return sum(seq.layout.num_scheduled_tokens for seq in self.seqs)

    @property
    def attn_metadata(self) -> HpuAttentionMetadata:
        """The first KV cache group's metadata (the only one without groups)."""
        return self.group_metadata[0]

    def metadata_by_layer(
        self, layer_groups: Mapping[str, int]
    ) -> dict[str, HpuAttentionMetadata]:
        """Each attention layer's metadata, from its KV cache group's index
        (a pass built for one group, as profiling's, serves every layer)."""
        if len(self.group_metadata) == 1:
            return dict.fromkeys(layer_groups, self.group_metadata[0])
        return {name: self.group_metadata[g] for name, g in layer_groups.items()}

    @property
    def last_token_indices(self) -> list[int]:
        return [
            first + seq.layout.num_scheduled_tokens - 1
            for first, seq in zip(self.first_token_indices, self.seqs, strict=True)
        ]


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
