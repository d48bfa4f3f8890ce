"""What a hybrid model's state layers (attention/state_layers.py) read of a pass, in
place of vLLM's Mamba2 metadata: each padded row's state slot, whether it
continues a state, and (prompt passes) how many of its tokens are real.

Rows are the pass's rows: prompt row ``i`` holds tokens ``i*Q .. i*Q + Q - 1``
of the flat ``[B*Q]`` pass, decode row ``i`` token ``i``; a verification pass
(speculative decoding) lists each row's tokens (``VerifyRows``). Padding rows
read no state and write the dummy slot. Tensors only (besides the phase), so a
bucket's shapes fix the graph.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class HpuStateMetadata:
    is_prompt: bool
    state_slots: torch.Tensor  # [B] long; padding rows -> the dummy slot
    # [B] bool: the row continues its request's state (num_computed_tokens > 0);
    # else its slot may hold a previous owner's state, read as zeros.
    has_initial_state: torch.Tensor
    query_lens: torch.Tensor  # [B] long: real tokens per row; padding rows 0
    verify: "VerifyRows | None" = None  # a verification pass's rows
    # Speculative decoding: each slot takes the snapshot of its request's last
    # accepted token before the pass (state_cache.py); None when none does.
    accepted: "SlotCopies | None" = None


@dataclass(frozen=True)
class VerifyRows:
    """A verification pass token by token: row ``r``'s ``j``-th token (its
    last sampled token, then its drafts) sits at flat index ``tokens[r, j]``
    (the pass's token count where it has none), steps the state in
    ``slots[r, j]`` (its request's slot, else the dummy slot), and the state
    after it is kept in ``snapshots[r, j]``, a page of its own per draft."""

    tokens: torch.Tensor  # [R, Q] long
    slots: torch.Tensor  # [R, Q] long
    snapshots: torch.Tensor  # [R, Q] long


@dataclass(frozen=True)
class SlotCopies:
    """Whole-page copies ``src[i] -> dst[i]`` between state slots."""

    src: torch.Tensor  # [n] long
    dst: torch.Tensor  # [n] long


@dataclass(frozen=True)
class StateRow:
    """One scheduled request's row of a pass."""

    slot: int
    num_computed_tokens: int
    num_scheduled_tokens: int
    first_token_index: int = 0  # in the flat pass (verification passes)


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


def build_verify_rows(
    rows: list[StateRow],
    shape: tuple[int, int, int],
    dummy_slot: int,
    snapshot: Callable[[int, int], int],
    torch_device: torch.device,
) -> VerifyRows:
    """``shape``: (rows ``R``, tokens per row ``Q``, the pass's tokens ``N``);
    ``snapshot(slot, j)``: the page keeping a slot's state after token j."""
    num_rows, num_queries, num_tokens = shape
    tokens = np.full((num_rows, num_queries), num_tokens, dtype=np.int64)
    slots = np.full_like(tokens, dummy_slot)
    snapshots = np.full_like(tokens, dummy_slot)
    for r, row in enumerate(rows):
        count = row.num_scheduled_tokens
        tokens[r, :count] = row.first_token_index + np.arange(count)
        slots[r, :count] = row.slot
        snapshots[r, :count] = [snapshot(row.slot, j) for j in range(count)]
    return VerifyRows(
        *(torch.from_numpy(t).to(torch_device) for t in (tokens, slots, snapshots))
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
