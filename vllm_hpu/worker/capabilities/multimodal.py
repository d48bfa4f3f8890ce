"""Multimodal inputs: vision encoder passes, vLLM's encoder cache, and the input
embeddings of each forward pass with the encoder outputs merged in."""

import itertools
from collections.abc import Sequence
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.encoder_budget import MultiModalBudget
from vllm.multimodal.inputs import MultiModalFeatureSpec, MultiModalKwargsItem
from vllm.multimodal.utils import get_mm_features_in_window, group_and_batch_mm_kwargs
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch
from vllm.v1.worker.utils import sanity_check_mm_encoder_outputs

from vllm_hpu import device
from vllm_hpu.bucketing.tile_buckets import (
    TileBuckets,
    is_tiled_item,
    item_tiles,
)
from vllm_hpu.bucketing.vision_buckets import (
    PatchBuckets,
    group_by_patches,
    is_grid_item,
    item_patches,
)
from vllm_hpu.worker.diagnostics.profiler import StepProfiler
from vllm_hpu.worker.passes.forward_pass import ForwardPass

logger = init_logger("vllm.hpu.multimodal")

EncoderItem = tuple[str, MultiModalKwargsItem]  # (modality, processed inputs)


def encoder_batch_sizes(max_items: int) -> list[int]:
    """Items per encoder pass: powers of two up to (and including) ``max_items``."""
    sizes = [1]
    while sizes[-1] < max_items:
        sizes.append(min(sizes[-1] * 2, max_items))
    return sizes


class TextInputs:
    """A pass's token ids, for a model without media or past the first stage."""

    def update(self, scheduler_output: SchedulerOutput) -> None:
        pass

    def warm_up(self) -> None:
        pass

    def reset(self) -> None:
        pass

    def inputs(self, forward_pass: ForwardPass) -> dict[str, Any]:
        return {"input_ids": forward_pass.input_ids}


class MultimodalInputs(TextInputs):
    """Runs the encoder once per item, keeps outputs by hash until freed, builds the
    input embeddings; encoder passes use the buckets :meth:`warm_up` ran."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        model: Any,
        input_batch: InputBatch,
        requests: dict[str, CachedRequestState],
        torch_device: torch.device,
        profiler: StepProfiler,
    ):
        self.model = model
        self.profiler = profiler
        self.device = torch_device
        self.input_batch = input_batch
        self.requests = requests
        self.budget = MultiModalBudget(vllm_config, MULTIMODAL_REGISTRY)
        max_items = max(self.budget.mm_max_items_per_batch.values(), default=1)
        self.batch_sizes = encoder_batch_sizes(max_items)
        # Per modality whose items are patch grids (dynamic resolution).
        self.patch_buckets = {
            modality: buckets
            for modality in self.budget.mm_max_items_per_batch
            if (buckets := self._patch_buckets(modality)) is not None
        }
        # Per modality whose items are tiles (Llama 4).
        self.tile_buckets = {
            modality: tiles
            for modality in self.budget.mm_max_items_per_batch
            if (tiles := self._tile_buckets(modality)) is not None
        }
        self.encoder_cache: dict[str, torch.Tensor] = {}

    def _patch_buckets(self, modality: str) -> PatchBuckets | None:
        """Patch buckets sized by vLLM's largest item (its dummy) and budget."""
        dummy = self.budget.get_dummy_encoder_profile_inputs(modality, 1)
        if not dummy or not is_grid_item(modality, dummy[0][1]):
            return None
        item = dummy[0][1]
        return PatchBuckets.from_budget(
            self.batch_sizes,
            item_patches(modality, item),
            self.budget.mm_max_toks_per_item[modality],
            self.budget.encoder_compute_budget,
        )

    def _tile_buckets(self, modality: str) -> TileBuckets | None:
        """Tile buckets sized by vLLM's largest item (its dummy) and budget."""
        dummy = self.budget.get_dummy_encoder_profile_inputs(modality, 1)
        if not dummy or not is_tiled_item(modality, dummy[0][1]):
            return None
        return TileBuckets.from_budget(
            item_tiles(dummy[0][1]),
            self.budget.mm_max_toks_per_item[modality],
            self.budget.encoder_compute_budget,
        )

    # ---- encoder -----------------------------------------------------------

    def update(self, scheduler_output: SchedulerOutput) -> None:
        """Free what the scheduler no longer needs, then encode the new items."""
        for mm_hash in scheduler_output.free_encoder_mm_hashes:
            self.encoder_cache.pop(mm_hash, None)
        hashes: list[str] = []
        items: list[EncoderItem] = []
        for req_id, indices in scheduler_output.scheduled_encoder_inputs.items():
            for index in indices:
                feature = self.requests[req_id].mm_features[index]
                if feature.data is not None:
                    hashes.append(feature.identifier)
                    items.append((feature.modality, feature.data))
        # One modality per encoder pass: sorting keeps each modality together.
        order = sorted(range(len(items)), key=lambda i: items[i][0])
        outputs = self.encode([items[i] for i in order])
        for i, output in zip(order, outputs, strict=True):
            self.encoder_cache[hashes[i]] = output

    def encode(self, items: Sequence[EncoderItem]) -> list[torch.Tensor]:
        """Encoder outputs of ``items`` (sorted by modality), in bucketed passes."""
        outputs: list[torch.Tensor] = []
        for (modality, layout), group in itertools.groupby(items, key=self._layout):
            run = list(group)
            if layout == "grid":
                outputs += self._encode_grids(run, self.patch_buckets[modality])
            elif layout == "tiles":
                outputs += self._encode_tiles(run, self.tile_buckets[modality])
            else:
                outputs += self._encode_items(run)
        return outputs

    def _layout(self, item: EncoderItem) -> tuple[str, str]:
        """(modality, bucketing of its passes: by patch grids, tiles or items)."""
        modality = item[0]
        if modality in self.patch_buckets and is_grid_item(*item):
            return modality, "grid"
        if modality in self.tile_buckets and is_tiled_item(*item):
            return modality, "tiles"
        return modality, "items"

    def _encode_grids(
        self, items: list[EncoderItem], buckets: PatchBuckets
    ) -> list[torch.Tensor]:
        """Patch grids of one modality, in passes padded to (images, patches)."""
        modality = items[0][0]
        patches = [item_patches(modality, item) for _, item in items]
        outputs: list[torch.Tensor] = []
        for start, end in group_by_patches(buckets, patches):
            ((_, num_items, kwargs),) = group_and_batch_mm_kwargs(
                items[start:end], device=self.device
            )
            shape = buckets.shape(num_items, sum(patches[start:end]))
            padded = buckets.pad(kwargs, modality, shape)
            outputs += self._run_encoder(padded, shape[0] + 1)[:num_items]
        return outputs

    def _encode_tiles(
        self, items: list[EncoderItem], buckets: TileBuckets
    ) -> list[torch.Tensor]:
        """Tiled images of one modality, in passes padded to a bucket of tiles."""
        tiles = [item_tiles(item) for _, item in items]
        outputs: list[torch.Tensor] = []
        for start, end in buckets.group(tiles):
            ((_, num_items, kwargs),) = group_and_batch_mm_kwargs(
                items[start:end], device=self.device
            )
            used = sum(tiles[start:end])
            num_tiles = buckets.bucket(used)
            padded = buckets.pad(kwargs, num_tiles)
            with_padding = num_items + int(num_tiles > used)
            outputs += self._run_encoder(padded, with_padding)[:num_items]
        return outputs

    def _run_encoder(
        self, kwargs: dict[str, Any], num_items: int
    ) -> list[torch.Tensor]:
        batch_outputs = self.model.embed_multimodal(**kwargs)
        sanity_check_mm_encoder_outputs(batch_outputs, expected_num_items=num_items)
        device.mark_step()
        return list(batch_outputs)

    def _encode_items(self, items: Sequence[EncoderItem]) -> list[torch.Tensor]:
        """Fixed-size items in passes padded to a bucket of items."""
        outputs: list[torch.Tensor] = []
        start = 0
        while start < len(items):
            size = self._bucket(len(items) - start)
            chunk = list(items[start : start + size])
            outputs += self._encode_padded(chunk, size)[: len(chunk)]
            start += len(chunk)
        return outputs

    def _bucket(self, num_items: int) -> int:
        """The smallest bucket holding ``num_items``, else the largest bucket."""
        return next(
            (s for s in self.batch_sizes if s >= num_items), self.batch_sizes[-1]
        )

    def _encode_padded(self, items: list[EncoderItem], size: int) -> list[torch.Tensor]:
        padded = items + [items[-1]] * (size - len(items))
        outputs: list[torch.Tensor] = []
        for _, num_items, kwargs in group_and_batch_mm_kwargs(
            padded, device=self.device
        ):
            outputs += self._run_encoder(kwargs, num_items)
        return outputs

    def warm_up(self) -> None:
        """One encoder pass per bucket on vLLM's largest dummy item per modality."""
        for modality in self.budget.mm_max_items_per_batch:
            items = self.budget.get_dummy_encoder_profile_inputs(modality, 1)
            buckets = self.patch_buckets.get(modality)
            if buckets is not None:
                self._warm_up_grids(modality, items, buckets)
                continue
            if modality in self.tile_buckets:
                self._warm_up_tiles(items, self.tile_buckets[modality])
                continue
            for size in self.batch_sizes:
                self._encode_padded(items * size, size)
            logger.info("Warmed up encoder passes of %s items", self.batch_sizes)

    def _warm_up_grids(
        self, modality: str, items: list[EncoderItem], buckets: PatchBuckets
    ) -> None:
        """One pass per (images, patches) bucket, of padding images only."""
        ((_, _, kwargs),) = group_and_batch_mm_kwargs(items, device=self.device)
        empty = buckets.empty(kwargs, modality)
        shapes = buckets.warmup_shapes()
        for shape in shapes:
            self._run_encoder(buckets.pad(empty, modality, shape), shape[0] + 1)
        logger.info(
            "Warmed up %d encoder passes of (%ss, patches): %s",
            len(shapes),
            modality,
            shapes,
        )

    def _warm_up_tiles(self, items: list[EncoderItem], buckets: TileBuckets) -> None:
        """One pass per tile bucket, of one padding image each."""
        ((_, _, kwargs),) = group_and_batch_mm_kwargs(items, device=self.device)
        empty = buckets.empty(kwargs)
        for num_tiles in buckets.warmup_shapes():
            self._run_encoder(buckets.pad(empty, num_tiles), 1)
        logger.info("Warmed up encoder passes of %s tiles", buckets.warmup_shapes())

    def reset(self) -> None:
        """Forget encoder outputs, as vLLM's scheduler does (pause, sleep)."""
        self.encoder_cache.clear()

    # ---- input embeddings ---------------------------------------------------

    def inputs(self, forward_pass: ForwardPass) -> dict[str, Any]:
        """Input embeddings on every pass, so each bucket compiles one graph."""
        with self.profiler.span("embed", bucket=forward_pass.bucket):
            embeds = self._embed(forward_pass)
        return {"input_ids": None, "inputs_embeds": embeds}

    def _embed(self, forward_pass: ForwardPass) -> torch.Tensor:
        """The pass's input embeddings, encoder outputs at their placeholders."""
        num_tokens = forward_pass.num_tokens
        is_multimodal = torch.zeros(num_tokens, dtype=torch.bool)
        embeds: list[torch.Tensor] = []
        for first, seq in zip(
            forward_pass.first_token_indices, forward_pass.seqs, strict=True
        ):
            for feature in self._features_in_window(seq.row, seq.start, seq.end):
                embeds += self._gather(
                    feature, seq.start, seq.end, first, is_multimodal
                )
        input_ids = forward_pass.input_ids
        if not embeds:
            inputs_embeds = self.model.embed_input_ids(input_ids)
        else:
            inputs_embeds = self.model.embed_input_ids(
                input_ids, embeds, is_multimodal=is_multimodal.to(input_ids.device)
            )
        self._hold_deepstack_rows(num_tokens)
        return inputs_embeds

    def _hold_deepstack_rows(self, num_tokens: int) -> None:
        """Qwen3-VL reads deepstack rows only if a Python int (compile-specialised) says
        so: every pass says ``num_tokens``; the buffer grows here, outside the graph."""
        buffers = getattr(self.model, "deepstack_input_embeds", None)
        if not buffers:
            return
        if num_tokens > buffers[0].size(0):
            self.model._resize_deepstack_input_embeds(num_tokens)
        self.model.deepstack_input_embeds_num_tokens = num_tokens

    def _features_in_window(
        self, row: int, start: int, end: int
    ) -> list[MultiModalFeatureSpec]:
        # profile_run's rows belong to no request.
        if row >= self.input_batch.num_reqs:
            return []
        features = self.requests[self.input_batch.req_ids[row]].mm_features
        lo, hi = get_mm_features_in_window(features, start, end)
        return features[lo:hi]

    def _gather(
        self,
        feature: MultiModalFeatureSpec,
        start: int,
        end: int,
        first_index: int,
        is_multimodal: torch.Tensor,
    ) -> list[torch.Tensor]:
        """Encoder rows of ``feature`` in scheduled tokens [start, end), the first at
        ``first_index``; marks them in ``is_multimodal``. Chunks may split an item."""
        placeholder = feature.mm_position
        lo = max(start - placeholder.offset, 0)
        hi = min(end - placeholder.offset, placeholder.length)
        embeds_lo, embeds_hi = placeholder.get_embeds_indices_in_range(lo, hi)
        if embeds_lo == embeds_hi:
            return []
        output = self.encoder_cache.get(feature.identifier)
        if output is None:
            raise RuntimeError(
                f"No encoder output for multimodal item {feature.identifier}: the "
                "scheduler must schedule its encoder input before its tokens."
            )
        flat = first_index + placeholder.offset + lo - start
        if placeholder.is_embed is None:
            is_multimodal[flat : flat + hi - lo] = True
        else:
            is_multimodal[flat : flat + hi - lo] |= placeholder.is_embed[lo:hi]
        return [output[embeds_lo:embeds_hi]]
