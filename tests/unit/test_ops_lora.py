"""The static-shape LoRA ops against a per-token loop over each token's adapter."""

import pytest
import torch

from vllm_hpu.ops.punica import lora_expand, lora_shrink

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


def test_punica_wrapper_adds_each_tokens_adapter_beyond_its_buffers():
    """Adapter ids 0 (none), 7 and 9 in slots 1 and 0, over more tokens than the
    wrapper was sized for, through two output slices (as q/k/v packed)."""
    from vllm.lora.layers import LoRAMapping

    from vllm_hpu.ops.punica import HpuPunicaWrapper

    wrapper = HpuPunicaWrapper(4, 2, "cpu")
    lora_ids = (7, 0, 9, 9, 7, 0)
    mapping = LoRAMapping(lora_ids, lora_ids, is_prefill=True)
    wrapper.update_metadata(mapping, [9, 7, None], NUM_SLOTS, 100)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(len(lora_ids), IN_SIZE, generator=generator)
    slices = (OUT_SIZE, OUT_SIZE // 2)
    lora_a = [torch.randn(NUM_SLOTS, 1, RANK, IN_SIZE, generator=generator)] * 2
    lora_b = [torch.randn(NUM_SLOTS, 1, n, RANK, generator=generator) for n in slices]
    y = torch.zeros(len(lora_ids), sum(slices))
    wrapper.add_lora_linear(y, x, tuple(lora_a), tuple(lora_b), 1.0, slices)
    slots = torch.tensor([1, -1, 0, 0, 1, -1])
    want = torch.cat(
        [_reference(x, a, b, slots, 1.0) for a, b in zip(lora_a, lora_b, strict=True)],
        dim=1,
    )
    torch.testing.assert_close(y, want)
