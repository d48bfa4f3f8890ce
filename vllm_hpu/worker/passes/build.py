"""Step 3 of planning: a group of scheduled seqs as one padded forward pass, with
``attention/``'s metadata. Prompt row ``i``'s token ``t`` is at ``i * query_len
+ t``; a merged pass packs its chunks in turn; decode row ``i`` is at ``i``;
verification packs rows into groups of ``Q`` slots (``attention/verify.py``).
Padding is id 0 at position 0, writing the dummy block."""

from collections.abc import Callable

import numpy as np
import torch
from vllm.utils.math_utils import cdiv

from vllm_hpu.attention.merged_metadata import build_merged_prompt_metadata
from vllm_hpu.attention.metadata import (
    CacheGeometry,
    HpuAttentionMetadata,
    SeqLayout,
    build_decode_metadata,
    build_prompt_metadata,
)
from vllm_hpu.attention.verify import num_groups, pack_rows
from vllm_hpu.bucketing import Bucket, HpuBucketManager
from vllm_hpu.bucketing.prompt_passes import pass_shape
from vllm_hpu.worker.passes.forward_pass import ForwardPass
from vllm_hpu.worker.passes.seqs import ScheduledSeq


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(array).to(device)


MetadataBuilder = Callable[[list[SeqLayout], CacheGeometry], HpuAttentionMetadata]


def group_metadata(
    seqs: list[ScheduledSeq], cache: CacheGeometry, build: MetadataBuilder
) -> tuple[HpuAttentionMetadata, ...]:
    """The pass's metadata per KV cache group: one bucket's shapes, each group's
    block tables and windows; a state group repeats the first attention group's."""
    geometries = cache.group_geometries()
    built = {
        index: build([seq.group_layout(index) for seq in seqs], group)
        for index, group in enumerate(geometries)
        if not group.holds_states
    }
    first = next(iter(built.values()))
    return tuple(built.get(index, first) for index in range(len(geometries)))


def _forward_pass(
    is_prompt: bool,
    bucket: Bucket,
    seqs: list[ScheduledSeq],
    tokens: tuple[np.ndarray, np.ndarray],
    cache: CacheGeometry,
    first_token_indices: list[int],
    build: MetadataBuilder,
) -> ForwardPass:
    """The pass on the device, with each KV cache group's metadata."""
    input_ids, positions = tokens
    return ForwardPass(
        is_prompt=is_prompt,
        bucket=bucket,
        seqs=seqs,
        input_ids=_to_device(input_ids, cache.device),
        positions=_to_device(positions, cache.device),
        group_metadata=group_metadata(seqs, cache, build),
        first_token_indices=first_token_indices,
    )


def build_prompt_forward(
    seqs: list[ScheduledSeq],
    buckets: HpuBucketManager,
    token_ids: np.ndarray,
    cache: CacheGeometry,
) -> ForwardPass:
    """The prompt pass over ``seqs``: a row per chunk, or merged, all chunks in one
    row; ``token_ids`` is InputBatch.token_ids_cpu."""
    merged = buckets.config.merged_prefill
    bucket = buckets.find_prompt_bucket(*pass_shape(seqs, merged, cache.block_size))
    if merged:
        lengths = [seq.layout.num_scheduled_tokens for seq in seqs]
        first_token_indices = np.cumsum([0, *lengths[:-1]]).tolist()

        def build(
            layouts: list[SeqLayout], group: CacheGeometry
        ) -> HpuAttentionMetadata:
            return build_merged_prompt_metadata(
                layouts, bucket.query_len, bucket.num_blocks, group
            )
    else:
        first_token_indices = [i * bucket.query_len for i in range(len(seqs))]

        def build(
            layouts: list[SeqLayout], group: CacheGeometry
        ) -> HpuAttentionMetadata:
            return build_prompt_metadata(
                layouts, bucket.batch_size, bucket.query_len, bucket.num_blocks, group
            )

    num_tokens = bucket.batch_size * bucket.query_len
    tokens = _placed_tokens(seqs, token_ids, first_token_indices, num_tokens)
    return _forward_pass(True, bucket, seqs, tokens, cache, first_token_indices, build)


def build_decode_pass(
    seqs: list[ScheduledSeq],
    buckets: HpuBucketManager,
    token_ids: np.ndarray,
    cache: CacheGeometry,
    num_queries: int = 1,
) -> ForwardPass:
    """A decode pass: one token per seq, or verifying drafts each row's last token
    and drafts, rows packed into groups of ``num_queries`` slots."""
    starts = pack_rows([s.layout.num_scheduled_tokens for s in seqs], num_queries)
    num_blocks = flat_blocks(seqs, cache.block_size)
    bucket = buckets.find_decode_bucket(
        num_groups(starts, num_queries), num_blocks, num_queries
    )
    input_ids, positions = _placed_tokens(
        seqs, token_ids, starts, bucket.batch_size * num_queries
    )
    return _forward_pass(
        False,
        bucket,
        seqs,
        (input_ids, positions),
        cache,
        starts,
        lambda layouts, group: build_decode_metadata(
            layouts, bucket.batch_size, bucket.num_blocks, group, starts, num_queries
        ),
    )


def flat_blocks(seqs: list[ScheduledSeq], block_size: int) -> int:
    """The flat blocks a decode or verification pass over ``seqs`` reads."""
    return sum(cdiv(s.end, block_size) for s in seqs)


def _placed_tokens(
    seqs: list[ScheduledSeq], token_ids: np.ndarray, starts: list[int], size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and positions of ``size`` tokens, seq i's from ``starts[i]``."""
    input_ids = np.zeros(size, dtype=np.int64)
    positions = np.zeros_like(input_ids)
    for seq, start in zip(seqs, starts, strict=True):
        end = start + seq.layout.num_scheduled_tokens
        input_ids[start:end] = token_ids[seq.row, seq.start : seq.end]
        positions[start:end] = np.arange(seq.start, seq.end)
    return input_ids, positions
