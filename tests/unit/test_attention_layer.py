"""vLLM's own Attention layer driven through our backend: prefill, decodes, then a
prompt chunk with cached context, each against naive per-sequence attention;
plain, and with the sliding window, soft-cap and ALiBi vLLM's models pass it."""

import random

import pytest
import torch
from test_ops_reference import PLAIN, Variant, alibi_slopes, naive_attention, tolerance
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.forward_context import set_forward_context
from vllm.model_executor.layers.attention import Attention

from vllm_hpu.attention.backend import HpuAttentionImpl
from vllm_hpu.attention.metadata import (
    CacheGeometry,
    HpuAttentionMetadata,
    SeqLayout,
    build_decode_metadata,
    build_prompt_metadata,
)
from vllm_hpu.ops.kv_cache import allocate_kv_cache

LAYER_NAME = "model.layers.0.self_attn.attn"
NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE = 8, 2, 64
BLOCK_SIZE, NUM_BLOCKS = 16, 24


class Driver:
    """One Attention layer plus the growing K/V/Q history of each sequence."""

    def __init__(self, dtype: torch.dtype, seed: int, variant: Variant) -> None:
        self.config = VllmConfig()
        self.dtype = dtype
        self.variant = variant
        slopes = alibi_slopes(NUM_HEADS).tolist() if variant.alibi else None
        with set_current_vllm_config(self.config):
            self.layer = Attention(
                NUM_HEADS,
                HEAD_SIZE,
                HEAD_SIZE**-0.5,
                NUM_KV_HEADS,
                alibi_slopes=slopes,
                prefix=LAYER_NAME,
                logits_soft_cap=variant.logits_soft_cap,
                per_layer_sliding_window=variant.sliding_window,
            )
        self.layer.kv_cache = allocate_kv_cache(
            NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE, dtype, torch.device("cpu")
        )
        ids = list(range(NUM_BLOCKS))
        random.Random(seed).shuffle(ids)
        self.tables = [ids[:8], ids[8:16]]
        self.keys: list[torch.Tensor] = [torch.empty(0, NUM_KV_HEADS, HEAD_SIZE)] * 2
        self.values = list(self.keys)
        windows = (variant.sliding_window,) if variant.sliding_window else ()
        self.geometry = CacheGeometry(
            BLOCK_SIZE, NUM_BLOCKS, dtype, torch.device("cpu"), windows
        )

    def step(
        self, new_tokens: list[int], padded: list[int], metadata: HpuAttentionMetadata
    ) -> None:
        """Run the layer on a padded batch and check every real token."""

        def rand(*shape: int) -> torch.Tensor:
            return torch.randn(*shape).to(self.dtype)

        rows, per_row = padded
        q = rand(rows, per_row, NUM_HEADS, HEAD_SIZE)
        k, v = (
            rand(rows, per_row, NUM_KV_HEADS, HEAD_SIZE),
            rand(rows, per_row, NUM_KV_HEADS, HEAD_SIZE),
        )
        for i, n in enumerate(new_tokens):
            self.keys[i] = torch.cat((self.keys[i], k[i, :n].float()))
            self.values[i] = torch.cat((self.values[i], v[i, :n].float()))
        with set_forward_context({LAYER_NAME: metadata}, self.config):
            out = self.layer(
                q.flatten(0, 1).flatten(1),
                k.flatten(0, 1).flatten(1),
                v.flatten(0, 1).flatten(1),
            )
        out = out.view(rows, per_row, NUM_HEADS, HEAD_SIZE)
        assert torch.isfinite(out).all()
        for i, n in enumerate(new_tokens):
            expected = naive_attention(
                q[i, :n],
                self.keys[i].to(self.dtype),
                self.values[i].to(self.dtype),
                HEAD_SIZE**-0.5,
                self.variant,
            )
            torch.testing.assert_close(
                out[i, :n].float(),
                expected,
                **tolerance(self.dtype),
                msg=lambda m, i=i: f"row {i}: {m}",
            )

    def seqs(self, new_tokens: list[int]) -> list[SeqLayout]:
        return [
            SeqLayout(self.tables[i], len(self.keys[i]), n)
            for i, n in enumerate(new_tokens)
        ]


@pytest.mark.parametrize(
    "variant",
    [
        PLAIN,
        Variant(sliding_window=21),
        Variant(logits_soft_cap=3.0),
        Variant(alibi=True),
    ],
    ids=str,
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_layer_prefill_decode_then_context_prompt(
    dtype: torch.dtype, variant: Variant
) -> None:
    driver = Driver(dtype, seed=7, variant=variant)
    assert isinstance(driver.layer.impl, HpuAttentionImpl)

    prompt = [37, 16]
    meta = build_prompt_metadata(driver.seqs(prompt), 3, 48, 0, driver.geometry)
    driver.step(prompt, [3, 48], meta)

    for _ in range(3):
        meta = build_decode_metadata(driver.seqs([1, 1]), 4, 10, driver.geometry)
        driver.step([1, 1], [4, 1], meta)

    chunk = [20, 32]  # contexts of 40 and 19 tokens: 3 and 2 blocks
    meta = build_prompt_metadata(driver.seqs(chunk), 2, 32, 4, driver.geometry)
    driver.step(chunk, [2, 32], meta)
