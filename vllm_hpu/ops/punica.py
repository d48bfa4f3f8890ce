"""Multi-LoRA in static shapes: every token multiplies all adapter slots at once
and a one-hot mask of its slot keeps its own, so no shape or branch depends on
which adapters a batch holds (a slot index of -1, no adapter, masks everything)."""

from typing import Any

import torch
from vllm.lora.layers import LoRAMapping
from vllm.lora.punica_wrapper.punica_base import PunicaWrapperBase


def slot_mask(indices: torch.Tensor, num_slots: int, rank: int) -> torch.Tensor:
    """indices: [num_tokens] slot per token, -1 for none -> [num_tokens,
    num_slots * rank], 1 on the token's own slot's rank columns."""
    slots = torch.arange(num_slots, device=indices.device)
    one_hot = (indices.unsqueeze(1) == slots.unsqueeze(0)).to(torch.float32)
    return one_hot.repeat_interleave(rank, dim=1)


def lora_shrink(
    x: torch.Tensor, lora_a: torch.Tensor, indices: torch.Tensor, scale: float
) -> torch.Tensor:
    """x: [num_tokens, in]; lora_a: [num_slots, 1, rank, in] ->
    [num_tokens, rank] in float32: x @ lora_a[slot].T * scale per token."""
    num_slots, _, rank, in_size = lora_a.shape
    all_slots = x.to(torch.float32) @ lora_a.reshape(-1, in_size).t().float()
    masked = all_slots * slot_mask(indices, num_slots, rank)
    return masked.view(-1, num_slots, rank).sum(dim=1) * scale


def lora_expand(
    x: torch.Tensor, lora_b: torch.Tensor, indices: torch.Tensor
) -> torch.Tensor:
    """x: [num_tokens, rank]; lora_b: [num_slots, 1, out, rank] ->
    [num_tokens, out] in float32: x @ lora_b[slot].T per token, 0 for slot -1."""
    num_slots, _, out_size, rank = lora_b.shape
    spread = x.float().repeat(1, num_slots) * slot_mask(indices, num_slots, rank)
    stacked = lora_b.squeeze(1).transpose(1, 2).reshape(num_slots * rank, out_size)
    return spread @ stacked.float()


class HpuPunicaWrapper(PunicaWrapperBase):
    """vLLM's punica interface on ``lora_shrink``/``lora_expand``: one mapping per
    padded pass (``token_lora_indices`` of bucket length); outputs in place."""

    def __init__(
        self,
        max_num_batched_tokens: int,
        max_batches: int,
        device: torch.device | str,
        **kwargs: Any,
    ):
        super().__init__(max_num_batched_tokens, max_batches, device)
        self.capacity = max_num_batched_tokens

    def update_metadata(
        self,
        mapping: LoRAMapping,
        lora_index_to_id: list[int | None],
        max_loras: int,
        vocab_size: int,
        **kwargs: Any,
    ) -> None:
        # Only index tensors: vLLM's segment metadata reads values back to the host.
        num_tokens = len(mapping.index_mapping)
        if num_tokens > self.capacity:
            self._grow(num_tokens)
        self._update_base_metadata(mapping, lora_index_to_id, max_loras, vocab_size)

    def _grow(self, num_tokens: int) -> None:
        """A bucket may exceed --max-num-batched-tokens, which sized vLLM's index
        buffers: grow them (warmup meets the largest bucket first, serving never)."""
        for name in (
            "_token_lora_indices",
            "_sampler_indices",
            "_sampler_indices_padded",
            "_embeddings_indices",
        ):
            old = getattr(self, name)
            setattr(self, name, old.new_empty(num_tokens))
        self.capacity = num_tokens

    def add_shrink(  # type: ignore[override]
        self,
        y: tuple[torch.Tensor, ...] | torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: tuple[torch.Tensor, ...],
        scale: float,
        **kwargs: Any,
    ) -> None:
        x = x.view(-1, x.shape[-1])
        for out, lora_a in zip(y, lora_a_stacked, strict=True):
            shrunk = lora_shrink(x, lora_a, self.token_lora_indices, scale)
            out.view(-1, out.shape[-1]).add_(shrunk.to(out.dtype))

    def add_expand(  # type: ignore[override]
        self,
        y: torch.Tensor,
        x: tuple[torch.Tensor, ...] | torch.Tensor,
        lora_b_stacked: tuple[torch.Tensor, ...],
        output_slices: tuple[int, ...],
        offset_start: int = 0,
        add_inputs: bool = True,
        **kwargs: Any,
    ) -> torch.Tensor:
        flat = y.view(-1, y.shape[-1])
        offset = offset_start
        for shrunk, lora_b, size in zip(x, lora_b_stacked, output_slices, strict=True):
            delta = lora_expand(shrunk, lora_b, self.token_lora_indices)
            target = flat[:, offset : offset + size]
            if add_inputs:
                target.add_(delta.to(y.dtype))
            else:
                target.copy_(delta.to(y.dtype))
            offset += size
        return y

    def add_lora_embedding(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_b_stacked: torch.Tensor,
        add_inputs: bool = True,
        **kwargs: Any,
    ) -> torch.Tensor:
        # x: each token's row of its adapter's embedding A, gathered by vLLM.
        return self.add_expand(
            y, (x,), (lora_b_stacked,), (y.shape[-1],), 0, add_inputs
        )

    def add_lora_linear(  # type: ignore[override]
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: tuple[torch.Tensor, ...],
        lora_b_stacked: tuple[torch.Tensor, ...],
        scale: float,
        output_slices: tuple[int, ...],
        *,
        buffer: tuple[torch.Tensor, ...] | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        x = x.view(-1, x.shape[-1])
        indices = self.token_lora_indices
        shrunk = tuple(lora_shrink(x, a, indices, scale) for a in lora_a_stacked)
        return self.add_expand(y, shrunk, lora_b_stacked, output_slices)

    def add_lora_logits(  # type: ignore[override]
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: torch.Tensor,
        lora_b_stacked: torch.Tensor,
        scale: float,
        *,
        buffer: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        indices = self.sampler_indices
        shrunk = lora_shrink(x.view(-1, x.shape[-1]), lora_a_stacked, indices, scale)
        delta = lora_expand(shrunk, lora_b_stacked, indices)
        y.view(-1, y.shape[-1]).add_(delta.to(y.dtype))
        return y

    def apply_lora_full_linear(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        weight_stacked: torch.Tensor,
        bias_stacked: torch.Tensor,
        module_enabled: torch.Tensor,
    ) -> torch.Tensor:
        # A full weight is a shrink whose "rank" is the output size.
        adapter_y = lora_shrink(x, weight_stacked, self.sampler_indices, 1.0)
        result = self._select_full_linear_output(
            y, adapter_y, bias_stacked, module_enabled
        )
        return y.copy_(result)
