"""The fp8_inc KV cache: e4m3 writes through a byte view, attention reads that
upcast, and the start-up mapping of the cache dtypes (the INC flow's checks:
test_inc_fp8.py)."""

from types import SimpleNamespace

import pytest
import torch
from vllm.v1.attention.selector import AttentionSelectorConfig

from vllm_hpu.attention.backend import check_supported
from vllm_hpu.attention.mla import check_mla_supported
from vllm_hpu.ops.kv_cache import (
    allocate_kv_cache,
    copy_blocks,
    gather_blocks,
    to_cache_dtype,
    write_to_cache,
)
from vllm_hpu.ops.paged_attention import DecodeBlocks, paged_attention
from vllm_hpu.ops.prompt_attention import PassKeys, gather_context, prompt_attention
from vllm_hpu.ops.prompt_mask import PromptBias, padded_rows_mask
from vllm_hpu.ops.score_mods import Scoring
from vllm_hpu.ops.sliced_attention import NO_SLICING, PromptSlicing
from vllm_hpu.quantization.inc import apply_fp8_options

FP8 = torch.float8_e4m3fn
BLOCK, KV_HEADS, HEADS, HEAD_SIZE = 16, 2, 4, 64


def _caches(num_blocks: int, dtype: torch.dtype, seed: int = 0):
    """Caches of ``dtype`` and a bf16 twin holding exactly what the first holds."""
    torch.manual_seed(seed)
    slots = torch.randperm(num_blocks * BLOCK)
    keys, values = torch.randn(2, len(slots), KV_HEADS, HEAD_SIZE) * 3
    cache = allocate_kv_cache(num_blocks, BLOCK, KV_HEADS, HEAD_SIZE, dtype, "cpu")
    for part, x in zip(cache, (keys, values), strict=True):
        write_to_cache(part, slots, x)
    twin = tuple(part.to(torch.bfloat16) for part in cache)
    return cache, twin


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def test_fp8_write_saturates_and_round_trips() -> None:
    x = torch.tensor([[[1000.0, -1000.0, 0.1, 3.3]]])
    cache = torch.zeros(4, 1, 4, dtype=FP8)
    write_to_cache(cache, torch.tensor([2]), x)
    assert cache[2, 0, :2].float().tolist() == [448.0, -448.0]
    torch.testing.assert_close(cache[2, 0, 2:].float(), x[0, 0, 2:], rtol=0.07, atol=0)
    torch.testing.assert_close(cache[2].float(), to_cache_dtype(x, FP8)[0].float())


def test_fp8_copy_blocks_copies_bytes() -> None:
    cache, _ = _caches(3, FP8)
    src, dst = torch.tensor([0, 1]), torch.tensor([1, 2])
    before = gather_blocks(cache[0], src, BLOCK).view(torch.uint8).clone()
    copy_blocks([cache], src, dst, BLOCK)
    after = gather_blocks(cache[0], dst, BLOCK).view(torch.uint8)
    assert torch.equal(after, before)


def _one_row_blocks(num_blocks: int) -> DecodeBlocks:
    return DecodeBlocks(
        block_list=torch.arange(num_blocks),
        block_groups=torch.zeros(num_blocks, dtype=torch.long),
        block_mapping=torch.ones(num_blocks, 1, dtype=torch.bfloat16),
        block_bias=torch.zeros(num_blocks, BLOCK, dtype=torch.bfloat16),
        block_offsets=torch.arange(num_blocks) * BLOCK - num_blocks * BLOCK,
    )


def test_paged_attention_reads_fp8_as_its_upcast() -> None:
    """An fp8 cache attends as the bf16 cache of its values; against the
    unquantized cache the error is e4m3's (about 0.03 here)."""
    cache, twin = _caches(4, FP8)
    full, _ = _caches(4, torch.bfloat16)
    query = torch.randn(1, HEADS, HEAD_SIZE, dtype=torch.bfloat16)
    blocks, scoring = _one_row_blocks(4), Scoring(HEAD_SIZE**-0.5, None)
    got = paged_attention(query, *cache, blocks, scoring)
    torch.testing.assert_close(got, paged_attention(query, *twin, blocks, scoring))
    error = _relative_error(got, paged_attention(query, *full, blocks, scoring))
    assert 1e-3 < error < 0.1  # fp8's rounding: not bf16's output, close to it


@pytest.mark.parametrize(
    "slicing", [NO_SLICING, PromptSlicing(1, 8)], ids=["whole", "tiles"]
)
def test_prompt_attention_with_fp8_context(slicing: PromptSlicing) -> None:
    cache, twin = _caches(2, FP8)
    block_list = torch.tensor([0, 1])
    query_len = 4
    query = torch.randn(1, query_len, HEADS, HEAD_SIZE, dtype=torch.bfloat16)
    key, value = torch.randn(2, 1, query_len, KV_HEADS, HEAD_SIZE).bfloat16()
    lens = torch.tensor([2 * BLOCK]), torch.tensor([query_len])
    mask = padded_rows_mask(*lens, query_len, 2 * BLOCK)
    bias = PromptBias(mask, torch.bfloat16)
    scoring = Scoring(HEAD_SIZE**-0.5, None, use_fused=False)
    fp8_past = gather_context(*cache, block_list, 1, BLOCK)
    got = prompt_attention(
        query, PassKeys(key, value, fp8_past), bias, scoring, slicing=slicing
    )
    past = gather_context(*twin, block_list, 1, BLOCK)
    want = prompt_attention(
        query, PassKeys(key, value, past), bias, scoring, slicing=slicing
    )
    torch.testing.assert_close(got, want)


def _vllm_config(cache_dtype: str, quantization: str | None = None):
    return SimpleNamespace(
        cache_config=SimpleNamespace(cache_dtype=cache_dtype),
        model_config=SimpleNamespace(quantization=quantization),
    )


@pytest.mark.parametrize("asked", ["fp8", "fp8_e4m3", "fp8_inc"])
def test_fp8_names_map_to_fp8_inc(asked: str) -> None:
    config = _vllm_config(asked)
    apply_fp8_options(config)  # type: ignore[arg-type]
    assert config.cache_config.cache_dtype == "fp8_inc"


def _selector(**overrides: object) -> AttentionSelectorConfig:
    base = AttentionSelectorConfig(
        head_size=128, dtype=torch.bfloat16, kv_cache_dtype="fp8_inc", block_size=128
    )
    return base._replace(**overrides)


def test_cache_dtypes_accepted_and_refused() -> None:
    check_supported(_selector())
    with pytest.raises(ValueError, match="fp8_e5m2: use --kv-cache-dtype auto or"):
        check_supported(_selector(kv_cache_dtype="fp8_e5m2"))
    with pytest.raises(ValueError, match=r"MLA.*fp8_inc: use --kv-cache-dtype auto"):
        check_mla_supported(_selector(head_size=576, use_mla=True))
