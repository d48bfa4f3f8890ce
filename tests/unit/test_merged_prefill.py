"""Merged prefill: packed prompt passes vs naive per-prompt attention, the packing
split, the merged buckets and warmup's packed requests.

Op cases build the metadata with build_merged_prompt_metadata, write the pass's
tokens through its slot_mapping (as the attention impl does) and compare every
prompt's rows with naive causal attention over that prompt alone.
"""

import itertools
import random
from collections.abc import Iterator

import pytest
import torch
from test_ops_reference import (
    PLAIN,
    Variant,
    alibi_slopes,
    fill_cache,
    naive_attention,
    random_layout,
    sink_logits,
    tolerance,
)

from vllm_hpu import device, envs
from vllm_hpu.attention.merged_metadata import build_merged_prompt_metadata
from vllm_hpu.attention.metadata import (
    CacheGeometry,
    HpuAttentionMetadata,
    SeqLayout,
)
from vllm_hpu.bucketing import BucketingConfig, HpuBucketManager, ServingLimits
from vllm_hpu.bucketing.buckets import Bucket
from vllm_hpu.bucketing.merged_buckets import merged_prompt_buckets
from vllm_hpu.bucketing.prompt_passes import pass_shape, split_merged
from vllm_hpu.envs import read_envs
from vllm_hpu.ops.kv_cache import write_to_cache
from vllm_hpu.ops.prompt_attention import PassKeys, gather_context, prompt_attention
from vllm_hpu.ops.prompt_mask import PromptBias, PromptMask
from vllm_hpu.ops.score_mods import Scoring
from vllm_hpu.ops.sliced_attention import NO_SLICING, PromptSlicing
from vllm_hpu.worker.passes.seqs import ScheduledSeq
from vllm_hpu.worker.passes.synthetic import merged_fake_chunks

BLOCK = 16


@pytest.fixture(params=[True, False], ids=["fused", "unfused"])
def fused_sdpa(request, monkeypatch) -> Iterator[bool]:
    monkeypatch.setenv("VLLM_PROMPT_USE_FUSEDSDPA", str(int(request.param)))
    monkeypatch.setattr(device, "_KERNELS", {})
    envs.get_envs.cache_clear()
    yield request.param
    envs.get_envs.cache_clear()


def test_packed_mask_is_block_diagonal_causal() -> None:
    # Prompt 0: two current tokens at positions 0, 1; prompt 1: one context key
    # (position 0) and one current token at position 1; one padding query.
    query_owner = torch.tensor([0, 0, 1, -1])
    query_position = torch.tensor([0, 1, 1, 0])
    key_owner = torch.cat((torch.tensor([1, -1]), query_owner))
    key_position = torch.cat((torch.tensor([0, 1]), query_position))
    mask = PromptMask(
        query_owner[None], query_position[None], key_owner[None], key_position[None]
    )
    allowed = mask.allowed(slice(0, 4), slice(0, 6))[0]
    expected = torch.tensor(
        [
            [0, 0, 1, 0, 0, 0],
            [0, 0, 1, 1, 0, 0],
            [1, 0, 0, 0, 1, 0],
            [0, 0, 0, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(allowed, expected)


def _spans_pass() -> HpuAttentionMetadata:
    """Prompt 0: positions 0..3, positions 1 and 2 one bidirectional span;
    prompt 1: positions 0..2, causal; one padding query."""
    geometry = CacheGeometry(4, 8, torch.float32, torch.device("cpu"))
    seqs = [SeqLayout([0], 0, 4, bidirectional_spans=((1, 2),)), SeqLayout([1], 0, 3)]
    return build_merged_prompt_metadata(seqs, 8, 0, geometry)


def test_packed_mask_spans_stay_within_their_prompt() -> None:
    mask = _spans_pass().prompt_mask
    assert mask is not None
    assert mask.allowed(slice(0, 8), slice(0, 8))[0].int().tolist() == [
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 0, 1, 0, 0, 0],
        [0, 0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 0, 0, 1],
    ]


def test_sliced_attention_keeps_the_keys_a_span_sees_ahead() -> None:
    """Tiles of 2 queries: query 1's tile ends before key 2, which its span
    sees; the sliced pass must equal the whole one."""
    metadata = _spans_pass()
    assert metadata.prompt_mask is not None
    generator = torch.Generator().manual_seed(0)
    query, key, value = (
        torch.randn(1, 8, 2, 16, generator=generator) for _ in range(3)
    )
    bias = PromptBias(metadata.prompt_mask, torch.float32)
    scoring = Scoring(0.25, None, False, None)
    keys = PassKeys(key, value, None)
    whole = prompt_attention(query, keys, bias, scoring)
    tiles = PromptSlicing(threshold=1, chunk_size=2)
    sliced = prompt_attention(query, keys, bias, scoring, slicing=tiles)
    torch.testing.assert_close(sliced, whole)


# (context, query) per prompt: none, partial and whole cached blocks, one token.
SHAPES = [
    [(0, 5), (0, 17), (0, 2)],
    [(0, 9), (20, 3), (32, 16), (7, 1)],
    [(16, 40)],
]
VARIANTS = [
    PLAIN,
    Variant(sliding_window=5),
    Variant(sliding_window=17),
    Variant(logits_soft_cap=2.0),
    Variant(alibi=True),
    Variant(sliding_window=9, alibi=True),
    Variant(sliding_window=17, sinks=True),
    Variant(attention_chunk=5),
    Variant(attention_chunk=17),
]


# Whole, and cut into tiles of 11 queries x 11 keys that straddle the prompts.
SLICINGS = [NO_SLICING, PromptSlicing(threshold=1, chunk_size=11)]


@pytest.mark.parametrize("slicing", SLICINGS, ids=["whole", "tiles"])
@pytest.mark.parametrize("variant", VARIANTS, ids=str)
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_packed_attention_matches_each_prompt_alone(
    shapes: list[tuple[int, int]],
    variant: Variant,
    dtype: torch.dtype,
    fused_sdpa: bool,
    slicing: PromptSlicing,
) -> None:
    rng = random.Random(len(shapes))
    num_kv_heads, group, head_size = 2, 2, 64
    num_heads = num_kv_heads * group
    contexts = [c for c, _ in shapes]
    seq_lens = [c + q for c, q in shapes]
    layout = random_layout(rng, seq_lens, BLOCK, (num_kv_heads, head_size), dtype)
    fill_cache(layout, contexts, BLOCK)
    seqs = [
        SeqLayout(t, c, q)
        for t, (c, q) in zip(layout.block_tables, shapes, strict=True)
    ]
    num_tokens = sum(q for _, q in shapes) + 7
    num_blocks = sum(-(-c // BLOCK) for c in contexts) + 1
    geometry = CacheGeometry(
        BLOCK,
        layout.num_blocks,
        dtype,
        torch.device("cpu"),
        **variant.geometry_fields(),
    )
    metadata = build_merged_prompt_metadata(seqs, num_tokens, num_blocks, geometry)

    query = torch.randn(1, num_tokens, num_heads, head_size).to(dtype)
    key = torch.randn(1, num_tokens, num_kv_heads, head_size).to(dtype)
    value = torch.randn(1, num_tokens, num_kv_heads, head_size).to(dtype)
    offsets = [0]
    for i, (c, q) in enumerate(shapes):
        key[0, offsets[-1] : offsets[-1] + q] = layout.keys[i][c:]
        value[0, offsets[-1] : offsets[-1] + q] = layout.values[i][c:]
        offsets.append(offsets[-1] + q)
    write_to_cache(layout.key_cache, metadata.slot_mapping, key[0])
    write_to_cache(layout.value_cache, metadata.slot_mapping, value[0])
    assert metadata.block_list is not None
    past_kv = gather_context(
        layout.key_cache, layout.value_cache, metadata.block_list, 1, BLOCK
    )
    assert metadata.prompt_mask is not None
    slopes = alibi_slopes(num_heads) if variant.alibi else None
    bias = PromptBias(
        metadata.prompt_mask,
        dtype,
        variant.sliding_window,
        slopes,
        variant.attention_chunk,
    )
    plain_only = variant.logits_soft_cap is not None or variant.alibi
    scale = head_size**-0.5
    sinks = sink_logits(num_heads).to(dtype) if variant.sinks else None
    scoring = Scoring(scale, variant.logits_soft_cap, not plain_only, sinks)

    keys = PassKeys(key, value, past_kv)
    out = prompt_attention(query, keys, bias, scoring, slicing=slicing)

    assert torch.isfinite(out).all(), "padding rows must stay finite"
    for i, (start, stop) in enumerate(itertools.pairwise(offsets)):
        expected = naive_attention(
            query[0, start:stop], layout.keys[i], layout.values[i], scale, variant
        )
        torch.testing.assert_close(
            out[0, start:stop].float(), expected, **tolerance(dtype)
        )


def test_packed_metadata_rejects_a_pack_beyond_its_bucket() -> None:
    geometry = CacheGeometry(BLOCK, 8, torch.float32, torch.device("cpu"))
    seqs = [SeqLayout([0, 1], 20, 5)]
    with pytest.raises(ValueError, match="does not fit the bucket"):
        build_merged_prompt_metadata(seqs, 8, 1, geometry)


def _manager(**limits: int) -> HpuBucketManager:
    serving = ServingLimits(
        limits.get("max_num_seqs", 64),
        limits.get("max_num_batched_tokens", 2048),
        limits.get("max_model_len", 4096),
        limits.get("block_size", 128),
        use_context_buckets=True,
    )
    return HpuBucketManager(BucketingConfig.from_limits(serving, read_envs({})))


def test_merged_buckets_are_tokens_by_context() -> None:
    manager = _manager()
    assert manager.config.merged_prefill
    # Multiples of 64 below 256 tokens, then three values per doubling; the
    # largest and every other one below it, three, also with context.
    tokens = [64, 128, 192, 256, 320, 384, 512, 640, 768, 1024, 1280, 1536, 2048]
    with_context = [768, 1280, 2048]
    expected = [Bucket(1, t, 0) for t in tokens] + [
        Bucket(1, t, 32) for t in with_context
    ]
    assert manager.prompt_buckets == sorted(expected)
    assert merged_prompt_buckets(manager.config) == manager.prompt_buckets


def _seq(row: int, context: int, query: int) -> ScheduledSeq:
    table = list(range(100 * row, 100 * row + -(-(context + query) // 128)))
    return ScheduledSeq(row, SeqLayout(table, context, query))


def test_split_packs_a_step_and_splits_only_on_context() -> None:
    manager = _manager()
    step = [_seq(0, 0, 700), _seq(1, 0, 300), _seq(2, 3000, 40), _seq(3, 2000, 8)]
    packs = split_merged(step, manager, 128)
    # 24 + 16 context blocks exceed the most one request holds (32).
    assert [[s.row for s in pack] for pack in packs] == [[0, 1, 2], [3]]
    assert pass_shape(packs[0], True, 128) == (1, 1040, 24)
    assert manager.find_prompt_bucket(*pass_shape(packs[0], True, 128)) == Bucket(
        1, 1280, 32
    )


@pytest.mark.parametrize("bucket", [Bucket(1, 2048, 32), Bucket(1, 256, 0)], ids=str)
def test_warmup_chunks_pack_onto_their_bucket(bucket: Bucket) -> None:
    manager = _manager()
    chunks = merged_fake_chunks(bucket, bucket.num_blocks, 128, 4095)
    assert all(n <= 4095 and n - c >= 2 and c % 128 == 0 for n, c in chunks)
    tokens = sum(n - c for n, c in chunks)
    blocks = sum(c // 128 for _, c in chunks)
    assert (tokens, blocks) == (bucket.query_len, bucket.num_blocks)
    assert manager.covering_prompt_bucket(1, tokens, blocks) == bucket
