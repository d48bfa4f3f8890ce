"""What a hybrid model's state layers (attention/state_layers.py) read of a pass, in
place of vLLM's Mamba2 metadata: each padded row's state slot, whether it
continues a state, and (prompt passes) how many of its tokens are real.

Rows are the pass's rows: prompt row ``i`` holds tokens ``i*Q .. i*Q + Q - 1``
of the flat ``[B*Q]`` pass, decode row ``i`` token ``i``. Padding rows read
no state and write the dummy slot. Tensors only (besides the phase), so a
bucket's shapes fix the graph.
"""

from dataclasses import dataclass

import torch


@dataclass
class HpuStateMetadata:
    is_prompt: bool
    state_slots: torch.Tensor  # [B] long; padding rows -> the dummy slot
    # [B] bool: the row continues its request's state (num_computed_tokens > 0);
    # else its slot may hold a previous owner's state, read as zeros.
    has_initial_state: torch.Tensor
    query_lens: torch.Tensor  # [B] long: real tokens per row; padding rows 0


@dataclass(frozen=True)
class StateRow:
    """One scheduled request's row of a pass."""

    slot: int
    num_computed_tokens: int
    num_scheduled_tokens: int


def build_state_metadata(
    is_prompt: bool,
    rows: list[StateRow],
    batch_size: int,
    dummy_slot: int,
    torch_device: torch.device,
) -> HpuStateMetadata:
    """The metadata of a pass of ``batch_size`` rows, ``rows`` first."""
    pad = batch_size - len(rows)
    slots = [r.slot for r in rows] + [dummy_slot] * pad
    has_initial = [r.num_computed_tokens > 0 for r in rows] + [False] * pad
    query_lens = [r.num_scheduled_tokens for r in rows] + [0] * pad
    return HpuStateMetadata(
        is_prompt=is_prompt,
        state_slots=torch.tensor(slots, dtype=torch.long, device=torch_device),
        has_initial_state=torch.tensor(
            has_initial, dtype=torch.bool, device=torch_device
        ),
        query_lens=torch.tensor(query_lens, dtype=torch.long, device=torch_device),
    )


@dataclass(frozen=True)
class BlockCopies:
    """Whole-page copies between request slots and the block-addressed
    checkpoints of prefix caching (worker/capabilities/state_checkpoints.py):
    row ``i`` pairs ``slots[i]`` with ``blocks[g][i]`` in each state KV cache
    group ``g`` (a block id of that group's table)."""

    slots: torch.Tensor  # [n] long
    blocks: dict[int, torch.Tensor]  # group -> [n] long


@dataclass(frozen=True)
class StateCheckpointCopies:
    """A pass's copies: checkpoints into slots before it (prefix hits), slots
    into checkpoints after it (rows ending on a block boundary)."""

    restores: BlockCopies | None
    saves: BlockCopies | None
