"""The state cache of a hybrid model's Mamba2 / linear-attention layers.

Mamba cache mode "none" (hybrid_config.py): a request's state lives for its
whole life in one slot of each state layer's own tensor, ``max_num_seqs + 1``
slots (the last one the dummy slot, which padding rows write). vLLM's hybrid KV
cache manager still hands each request one block per state group; those blocks
are not used here, since the flat attention caches (``[2, blocks * block_size,
heads, head]``) cannot share pages with states the way vLLM's block-major
layout does. Slots are keyed by request id, not by InputBatch row (rows move
when the batch condenses) nor by block id.

With prefix caching (mode "align"), state_checkpoints.py also keeps each
layer's states at block boundaries, by block id, and copies them to and from
the slots around each pass.

With speculative decoding, a verification pass keeps the state after each of
a row's tokens in a snapshot page of its own (``num_speculative_tokens + 1``
per slot, as vLLM's speculative state blocks); the request's next pass first
copies the snapshot of its last accepted token into its slot, read from how
far vLLM resumed it (its tokens past that one were rejected).
"""

from collections.abc import Iterable, Mapping

import torch
from vllm.logger import init_logger
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.utils.mem_utils import format_gib
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig, MambaSpec
from vllm.v1.worker.gpu_input_batch import InputBatch

from vllm_hpu.attention.state_metadata import (
    HpuStateMetadata,
    SlotCopies,
    StateRow,
    build_state_metadata,
    build_verify_rows,
)
from vllm_hpu.worker.capabilities.state_checkpoints import (
    StateCheckpoints,
    kv_cache_share,
    state_layer_groups,
)
from vllm_hpu.worker.passes.forward_pass import ForwardPass

logger = init_logger("vllm.hpu.state_cache")


class StateSlots:
    """``req_id -> slot`` among ``num_slots`` slots; slot ``num_slots`` is the
    dummy slot; with speculative decoding, ``num_snapshots`` pages per slot
    follow (the states after each token of a verification row)."""

    def __init__(self, num_slots: int, num_snapshots: int = 0) -> None:
        self.num_slots = num_slots
        self.num_snapshots = num_snapshots
        self._free = list(range(num_slots - 1, -1, -1))  # pops slot 0 first
        self._slots: dict[str, int] = {}

    @property
    def dummy_slot(self) -> int:
        return self.num_slots

    @property
    def num_pages(self) -> int:
        """Slots, the dummy slot and the snapshots."""
        return (self.num_slots + 1) + self.num_slots * self.num_snapshots

    def snapshot(self, slot: int, index: int) -> int:
        """The page keeping ``slot``'s state after the ``index``-th token of
        its verification row."""
        assert 0 <= index < self.num_snapshots, (slot, index)
        return self.num_slots + 1 + slot * self.num_snapshots + index

    def __getitem__(self, req_id: str) -> int:
        return self._slots[req_id]

    def assign(self, req_ids: Iterable[str]) -> set[str]:
        """A slot for each request that has none; returns those requests."""
        assigned = set()
        for req_id in req_ids:
            if req_id in self._slots:
                continue
            if not self._free:
                raise RuntimeError(
                    f"No state slot left for request {req_id}: more than "
                    f"{self.num_slots} requests (max_num_seqs) hold states."
                )
            self._slots[req_id] = self._free.pop()
            assigned.add(req_id)
        return assigned

    def release(self, req_ids: Iterable[str]) -> None:
        """Free the slots of requests that finished or were preempted (a
        resumed request starts again from its first token or a prefix hit)."""
        for req_id in req_ids:
            slot = self._slots.pop(req_id, None)
            if slot is not None:
                self._free.append(slot)


class StateCache:
    """What the runner asks of a hybrid model's state layers; a model without
    any (this class) keeps no state: every call does nothing."""

    def kv_cache_share(self, available: int) -> int:
        """Of ``available`` bytes, what vLLM may size its KV cache with."""
        return available

    def allocate(self, kv_cache_config: KVCacheConfig | None = None) -> None:
        pass

    def free(self) -> None:
        pass

    def before_update(self, scheduler_output: SchedulerOutput) -> None:
        pass

    def after_update(self) -> None:
        pass

    def add_metadata(self, passes: list[ForwardPass]) -> None:
        pass

    def metadata_by_layer(
        self, forward_pass: ForwardPass
    ) -> dict[str, HpuStateMetadata]:
        return {}

    def before_pass(self, forward_pass: ForwardPass) -> None:
        pass

    def after_pass(self, forward_pass: ForwardPass) -> None:
        pass


class HpuStateCache(StateCache):
    """Each state layer's slots, bound through the layer's own ``bind_kv_cache``
    (vLLM's views and dtypes of one packed page per slot)."""

    def __init__(
        self,
        layers: Mapping[str, MambaBase],
        specs: Mapping[str, MambaSpec],
        input_batch: InputBatch,
        max_num_seqs: int,
        torch_device: torch.device,
        prefix_caching: bool = False,
        num_speculative_tokens: int = 0,
    ) -> None:
        self.layers = layers
        self.specs = specs
        self.input_batch = input_batch
        num_snapshots = num_speculative_tokens + 1 if num_speculative_tokens else 0
        self.slots = StateSlots(max_num_seqs, num_snapshots)
        self.device = torch_device
        self.prefix_caching = prefix_caching
        self.checkpoints: StateCheckpoints | None = None  # after allocate()
        self._pages: dict[str, torch.Tensor] = {}  # each layer's int8 slots
        self._new_reqs: set[str] = set()  # slots assigned this step
        # Requests verified in their last pass: (slot, first token's position).
        self._verified: dict[str, tuple[int, int]] = {}

    @property
    def num_bytes(self) -> int:
        """Device memory of every layer's slots, dummy slot and snapshots."""
        return self.slots.num_pages * self._page_bytes

    @property
    def _page_bytes(self) -> int:
        """One slot's, or one block's checkpoint's, bytes over all layers."""
        return sum(spec.real_page_size_bytes for spec in self.specs.values())

    def kv_cache_share(self, available: int) -> int:
        """Less the slots, and with prefix caching less each block's
        checkpoints."""
        share = available - self.num_bytes
        if self.prefix_caching:
            page = max(spec.page_size_bytes for spec in self.specs.values())
            share = kv_cache_share(share, page, self._page_bytes)
        logger.info(
            "State slots%s of the hybrid model's state layers: %s GiB.",
            " and checkpoints" if self.prefix_caching else "",
            format_gib(available - share),
        )
        return share

    def allocate(self, kv_cache_config: KVCacheConfig | None = None) -> None:
        """Zeroed slots for every layer, bound to it; with the KV cache config
        and prefix caching, the checkpoints of its blocks too."""
        for name, layer in self.layers.items():
            page = self.specs[name].real_page_size_bytes
            self._pages[name] = torch.zeros(
                (self.slots.num_pages, 1, 1, page),
                dtype=torch.int8,
                device=self.device,
            )
            layer.bind_kv_cache(self._pages[name])
        if kv_cache_config is not None and self.prefix_caching:
            self.checkpoints = StateCheckpoints(
                state_layer_groups(kv_cache_config, list(self.layers)),
                {n: spec.real_page_size_bytes for n, spec in self.specs.items()},
                kv_cache_config.num_blocks,
                next(iter(self.specs.values())).block_size,
                self.device,
            )

    def free(self) -> None:
        """Drop every layer's slots and checkpoints (after the memory profile,
        and in sleep mode)."""
        for name, layer in self.layers.items():
            page = self.specs[name].real_page_size_bytes
            layer.bind_kv_cache(torch.empty((0, 1, 1, page), dtype=torch.int8))
        self._pages = {}
        self.checkpoints = None

    def before_update(self, scheduler_output: SchedulerOutput) -> None:
        for released in (
            scheduler_output.finished_req_ids,
            scheduler_output.preempted_req_ids or (),
            # Also those preempted without notice (vLLM's reset_prefix_cache).
            scheduler_output.scheduled_cached_reqs.resumed_req_ids,
        ):
            self.slots.release(released)
            for req_id in released:
                self._verified.pop(req_id, None)

    def after_update(self) -> None:
        """Slots for the requests in the batch (its rows are exactly the step's
        scheduled requests)."""
        self._new_reqs = self.slots.assign(self.input_batch.req_ids)

    def add_metadata(self, passes: list[ForwardPass]) -> None:
        """Each planned pass's state metadata, read from the batch now: with
        async scheduling the pass runs after the host moved on."""
        req_ids = self.input_batch.req_ids
        for forward_pass in passes:
            rows = [
                StateRow(
                    self.slots[req_ids[seq.row]],
                    seq.start,
                    seq.layout.num_scheduled_tokens,
                    first,
                )
                for seq, first in zip(
                    forward_pass.seqs, forward_pass.first_token_indices, strict=True
                )
            ]
            forward_pass.state_metadata = self._metadata(forward_pass, rows)
            forward_pass.state_metadata.accepted = self._accept(
                forward_pass, [req_ids[seq.row] for seq in forward_pass.seqs]
            )
            if self.checkpoints is not None:
                forward_pass.state_checkpoints = self.checkpoints.plan(
                    [
                        (row.slot, seq, req_ids[seq.row] in self._new_reqs)
                        for row, seq in zip(rows, forward_pass.seqs, strict=True)
                    ]
                )

    def _accept(
        self, forward_pass: ForwardPass, req_ids: list[str]
    ) -> SlotCopies | None:
        """For the pass's requests verified last step, the copy of the snapshot
        of their last accepted token into their slot: vLLM resumes them right
        after it. Records the requests this pass verifies."""
        src, dst = [], []
        verifies = is_verification(forward_pass)
        for req_id, seq in zip(req_ids, forward_pass.seqs, strict=True):
            verified = self._verified.pop(req_id, None)
            if verified is not None:
                slot, start = verified
                src.append(self.slots.snapshot(slot, seq.start - start - 1))
                dst.append(slot)
            if verifies:
                self._verified[req_id] = (self.slots[req_id], seq.start)
        if not src:
            return None
        return SlotCopies(*(torch.tensor(x, device=self.device) for x in (src, dst)))

    def before_pass(self, forward_pass: ForwardPass) -> None:
        """Speculative decoding: the accepted tokens' states into their slots.
        Prefix hits: the slots of the pass's new requests from their
        checkpoints (on the pass's stream, after earlier passes saved them)."""
        metadata = forward_pass.state_metadata
        accepted = metadata.accepted if metadata is not None else None
        if accepted is not None:
            for pages in self._pages.values():
                pages.index_copy_(0, accepted.dst, pages.index_select(0, accepted.src))
        copies = forward_pass.state_checkpoints
        if copies is not None and copies.restores is not None:
            assert self.checkpoints is not None
            self.checkpoints.restore(self._pages, copies.restores)

    def after_pass(self, forward_pass: ForwardPass) -> None:
        """Checkpoints of the rows that ended on a block boundary."""
        copies = forward_pass.state_checkpoints
        if copies is not None and copies.saves is not None:
            assert self.checkpoints is not None
            self.checkpoints.save(self._pages, copies.saves)

    def metadata_by_layer(
        self, forward_pass: ForwardPass
    ) -> dict[str, HpuStateMetadata]:
        """Each state layer's metadata for the pass; a pass not planned from a
        step (the memory profile's) runs every row on the dummy slot."""
        metadata = forward_pass.state_metadata or self._metadata(forward_pass, [])
        return dict.fromkeys(self.layers, metadata)

    def _metadata(
        self, forward_pass: ForwardPass, rows: list[StateRow]
    ) -> HpuStateMetadata:
        """A verification pass has room for a row per token."""
        bucket = forward_pass.bucket
        verifies = is_verification(forward_pass)
        num_rows = bucket.batch_size * (bucket.query_len if verifies else 1)
        metadata = build_state_metadata(
            forward_pass.is_prompt, rows, num_rows, self.slots.dummy_slot, self.device
        )
        if verifies:
            metadata.verify = build_verify_rows(
                rows,
                (num_rows, bucket.query_len, forward_pass.num_tokens),
                self.slots.dummy_slot,
                self.slots.snapshot,
                self.device,
            )
        return metadata


def is_verification(forward_pass: ForwardPass) -> bool:
    """A decode pass of several queries per row: drafts to verify."""
    return not forward_pass.is_prompt and forward_pass.bucket.query_len > 1
