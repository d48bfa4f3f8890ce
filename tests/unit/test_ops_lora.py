"""The static-shape LoRA ops against a per-token loop over each token's adapter."""

import pytest
import torch

from vllm_hpu.ops.lora import lora_expand, lora_shrink

NUM_SLOTS, RANK, IN_SIZE, OUT_SIZE = 3, 8, 32, 24


def _reference(x, lora_a, lora_b, indices, scale):
    out = torch.zeros(x.shape[0], lora_b.shape[2])
    for t, slot in enumerate(indices.tolist()):
        if slot >= 0:
            out[t] = (x[t] @ lora_a[slot, 0].t() * scale) @ lora_b[slot, 0].t()
    return out


@pytest.mark.parametrize("indices", [[0, 1, 2, -1, 1], [-1, -1], [2, 2, 2, 0]])
def test_shrink_then_expand_matches_per_token_reference(indices):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(len(indices), IN_SIZE, generator=generator)
    lora_a = torch.randn(NUM_SLOTS, 1, RANK, IN_SIZE, generator=generator)
    lora_b = torch.randn(NUM_SLOTS, 1, OUT_SIZE, RANK, generator=generator)
    slots = torch.tensor(indices)
    shrunk = lora_shrink(x, lora_a, slots, 0.5)
    assert shrunk.shape == (len(indices), RANK)
    got = lora_expand(shrunk, lora_b, slots)
    torch.testing.assert_close(got, _reference(x, lora_a, lora_b, slots, 0.5))
