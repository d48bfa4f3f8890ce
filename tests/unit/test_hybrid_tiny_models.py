"""The tiny hybrids: transformers generates from them, and their state pages, as
vLLM's own model classes size them, fit one 16-token attention block (fp32), so
the engine keeps block size 16 (design_hybrid §5)."""

import importlib
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from e2e.harness import hf_greedy
from models import HYBRID_MODELS, model_path
from transformers import AutoConfig
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

BLOCK_SIZE = 16
FP32_BYTES = 4
MAX_MODEL_LEN = 256  # "none" mode: one state block spans the whole sequence
# name -> (conv state shape, recurrent state shape): the Mamba2 convs run over
# x, B and C (128 + 2 * groups * 8: Granite 1 group, Nemotron-H 2), the
# delta-net models' over q, k and v
# (2*16 + 2*16 + 4*16).
EXPECTED_SHAPES = {
    "tiny-granite-4.0-h": ((3, 144), (8, 16, 8)),
    "tiny-qwen3-next": ((3, 128), (4, 16, 16)),
    "tiny-qwen3.5": ((3, 128), (4, 16, 16)),
    "tiny-qwen3.5-moe": ((3, 128), (4, 16, 16)),
    "tiny-nemotron-h": ((3, 160), (8, 16, 8)),
}
# name -> (state page bytes, attention kv heads * head size)
PAGES = {
    "tiny-granite-4.0-h": (5824, 64),
    "tiny-qwen3-next": (5632, 64),
    "tiny-qwen3.5": (5632, 128),
    "tiny-qwen3.5-moe": (5632, 128),
    "tiny-nemotron-h": (6016, 64),
}
MODEL_CLASSES = {
    "tiny-granite-4.0-h": ("granitemoehybrid", "GraniteMoeHybridForCausalLM"),
    "tiny-qwen3-next": ("qwen3_next", "Qwen3NextForCausalLM"),
    "tiny-qwen3.5": ("qwen3_5", "Qwen3_5ForCausalLM"),
    "tiny-qwen3.5-moe": ("qwen3_5", "Qwen3_5MoeForCausalLM"),
    "tiny-nemotron-h": ("nemotron_h", "NemotronHForCausalLM"),
}


def _model_class(name: str) -> Any:
    module, cls = MODEL_CLASSES[name]
    return getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), cls)


def _vllm_config_view(name: str) -> SimpleNamespace:
    """The parts of a VllmConfig the models' state-spec class methods read."""
    hf_config = AutoConfig.from_pretrained(model_path(name))
    return SimpleNamespace(
        model_config=SimpleNamespace(
            hf_config=hf_config, hf_text_config=hf_config, dtype=torch.float32
        ),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
        cache_config=SimpleNamespace(
            mamba_cache_dtype="auto",
            mamba_ssm_cache_dtype="auto",
            use_replayssm=False,
        ),
        speculative_config=None,
        num_speculative_tokens=0,
    )


@pytest.mark.parametrize("name", HYBRID_MODELS)
def test_state_page_fits_one_attention_block(name: str) -> None:
    model_class, config = _model_class(name), _vllm_config_view(name)
    shapes = model_class.get_mamba_state_shape_from_config(config)
    dtypes = model_class.get_mamba_state_dtype_from_config(config)
    assert tuple(map(tuple, shapes)) == EXPECTED_SHAPES[name]
    assert dtypes == (torch.float32, torch.float32)
    state_page = MambaSpec(
        block_size=MAX_MODEL_LEN, shapes=shapes, dtypes=dtypes
    ).real_page_size_bytes
    hf = config.model_config.hf_config
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    attention_page = FullAttentionSpec(
        block_size=BLOCK_SIZE,
        num_kv_heads=hf.num_key_value_heads,
        head_size=head_dim,
        dtype=torch.float32,
    ).page_size_bytes
    expected_state_page, kv_width = PAGES[name]
    assert state_page == expected_state_page
    assert attention_page == 2 * BLOCK_SIZE * kv_width * FP32_BYTES
    assert state_page <= attention_page


@pytest.mark.parametrize("name", HYBRID_MODELS)
def test_transformers_generates_from_hybrid(name: str) -> None:
    prompts = [[1, *range(10, 16)], [1, *range(40, 72)]]  # 7 and 33 tokens
    outputs = hf_greedy(model_path(name), prompts, 8, torch.float32)
    assert [len(tokens) for tokens in outputs] == [8, 8]
    assert outputs[0] != outputs[1]
    assert len(set(outputs[1])) >= 4, outputs


@pytest.mark.parametrize("name", HYBRID_MODELS)
def test_vllm_block_alignment_keeps_16_tokens_before_load(name: str) -> None:
    """vLLM's own hybrid alignment on our backend, from the config alone (no layers
    built yet, as in check_and_update_config): the block stays 16 tokens and the
    state page is padded up to the attention page."""
    from vllm.config import CacheConfig, ModelConfig, ParallelConfig

    from vllm_hpu.attention.backend import HpuAttentionBackend
    from vllm_hpu.platform import HpuPlatform

    cache_config = CacheConfig(block_size=BLOCK_SIZE)
    view = SimpleNamespace(
        model_config=ModelConfig(
            model=model_path(name), dtype="float32", max_model_len=MAX_MODEL_LEN
        ),
        cache_config=cache_config,
        parallel_config=ParallelConfig(),
        speculative_config=None,
        num_speculative_tokens=0,
        compilation_config=SimpleNamespace(static_forward_context={}),
    )
    HpuPlatform._align_hybrid_block_size(view, HpuAttentionBackend)
    assert cache_config.block_size == BLOCK_SIZE
    kv_width = PAGES[name][1]
    assert cache_config.mamba_page_size_padded == 2 * BLOCK_SIZE * kv_width * FP32_BYTES
