"""Emulation's linear layers run oneDNN on weights packed at load: same results
as F.linear, the layer's own weight dropped, embeddings left alone."""

import torch
from vllm.model_executor.layers.linear import UnquantizedLinearMethod
from vllm.model_executor.layers.vocab_parallel_embedding import (
    UnquantizedEmbeddingMethod,
)

from vllm_hpu.emulation.packed_linear import pack_linear_layers


class _Linear(torch.nn.Module):
    """What pack_linear_layers sees of a vLLM linear layer."""

    def __init__(self, out_features: int, in_features: int, dtype: torch.dtype):
        super().__init__()
        self.weight = torch.nn.Parameter(
            torch.randn(out_features, in_features, dtype=dtype), requires_grad=False
        )
        self.quant_method = UnquantizedLinearMethod()

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self.quant_method.apply(self, x, bias)


def test_packed_linear_matches_f_linear_and_drops_the_weight():
    torch.manual_seed(0)
    layer = _Linear(96, 64, torch.float32)
    weight = layer.weight.clone()
    bias = torch.randn(96)

    pack_linear_layers(layer)

    assert layer.weight.numel() == 0
    for rows in (1, 7, 64):
        x = torch.randn(rows, 64)
        expected = torch.nn.functional.linear(x, weight, bias)
        torch.testing.assert_close(layer(x, bias), expected, rtol=1e-5, atol=1e-5)


def test_packing_leaves_embeddings_and_plain_modules_alone():
    embedding = _Linear(8, 8, torch.float32)
    embedding.quant_method = UnquantizedEmbeddingMethod()  # an input embedding
    plain = torch.nn.Linear(8, 8)
    pack_linear_layers(torch.nn.ModuleList([embedding, plain]))
    assert embedding.weight.shape == (8, 8)
    assert "apply" not in vars(embedding.quant_method)
    assert plain.weight.shape == (8, 8)
