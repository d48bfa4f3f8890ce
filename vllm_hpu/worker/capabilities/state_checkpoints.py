"""Prefix caching of a hybrid model's states (Mamba "align", docs/design_align.md).

A prefix hit of ``h`` tokens gets the block that held the state after exactly
``h`` tokens; every prefill chunk but a prompt's last ends on a block boundary.
The live state stays in the request's slot (state_cache.py); each state layer
keeps one checkpoint page per block id: a pass ending on a boundary saves the
slot into block ``end // bs - 1``; a prefix hit restores from its last hit
block. Both copy whole pages (conv and recurrent) on the pass's stream."""

from collections.abc import Mapping

import torch
from vllm.v1.kv_cache_interface import KVCacheConfig

from vllm_hpu.attention.state_metadata import BlockCopies, StateCheckpointCopies
from vllm_hpu.worker.passes.seqs import ScheduledSeq


def state_layer_groups(
    kv_cache_config: KVCacheConfig, layer_names: list[str]
) -> dict[str, int]:
    """Each state layer's KV cache group (the index of its block table)."""
    groups = {
        name: index
        for index, group in enumerate(kv_cache_config.kv_cache_groups)
        for name in group.layer_names
    }
    return {name: groups[name] for name in layer_names}


class StateCheckpoints:
    """Each state layer's checkpoint pool, ``[num_blocks, 1, 1, page]`` int8
    like its slots, indexed by the block ids of its KV cache group."""

    def __init__(
        self,
        layer_groups: Mapping[str, int],
        page_sizes: Mapping[str, int],
        num_blocks: int,
        block_size: int,
        torch_device: torch.device,
    ) -> None:
        self.layer_groups = dict(layer_groups)
        self.block_size = block_size
        self.device = torch_device
        self.pools = {
            name: torch.zeros(
                (num_blocks, 1, 1, page_sizes[name]),
                dtype=torch.int8,
                device=torch_device,
            )
            for name in self.layer_groups
        }

    def plan(
        self, rows: list[tuple[int, ScheduledSeq, bool]]
    ) -> StateCheckpointCopies | None:
        """The copies of a pass's ``(slot, seq, slot_is_new)`` rows."""
        bs = self.block_size
        restores = [
            (slot, seq, (seq.start - 1) // bs)
            for slot, seq, is_new in rows
            if is_new and seq.start > 0
        ]
        saves = [
            (slot, seq, seq.end // bs - 1) for slot, seq, _ in rows if seq.end % bs == 0
        ]
        if not restores and not saves:
            return None
        return StateCheckpointCopies(self._copies(restores), self._copies(saves))

    def _copies(self, rows: list[tuple[int, ScheduledSeq, int]]) -> BlockCopies | None:
        if not rows:
            return None
        groups = sorted(set(self.layer_groups.values()))
        return BlockCopies(
            slots=self._tensor([slot for slot, _, _ in rows]),
            blocks={
                g: self._tensor([seq.tables[g][index] for _, seq, index in rows])
                for g in groups
            },
        )

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def restore(self, pages: Mapping[str, torch.Tensor], copies: BlockCopies) -> None:
        """Checkpoints into slots."""
        for name, pool in self.pools.items():
            blocks = copies.blocks[self.layer_groups[name]]
            pages[name].index_copy_(0, copies.slots, pool.index_select(0, blocks))

    def save(self, pages: Mapping[str, torch.Tensor], copies: BlockCopies) -> None:
        """Slots into checkpoints."""
        for name, pool in self.pools.items():
            blocks = copies.blocks[self.layer_groups[name]]
            pool.index_copy_(0, blocks, pages[name].index_select(0, copies.slots))


def kv_cache_share(available: int, page_bytes: int, checkpoint_bytes: int) -> int:
    """Of ``available`` bytes, what vLLM may size its KV blocks with when each block
    also costs ``checkpoint_bytes``: ``available * P / (P + S)``, P the page bytes."""
    return available * page_bytes // (page_bytes + checkpoint_bytes)
