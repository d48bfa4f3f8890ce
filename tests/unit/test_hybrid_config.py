"""A hybrid model's start-up settings (vllm_hpu/config/hybrid.py, platform step
10b/c): one state per request without prefix caching, a state block per KV
cache block with it (vLLM's "align"), refusals naming each option hybrids
cannot use yet, and the attention block sized to hold a state page before the
runner is built."""

import json
import shutil
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
import torch
from models import model_path
from vllm.v1.kv_cache_interface import MambaSpec

GRANITE = "tiny-granite-4.0-h"
MAX_MODEL_LEN = 256


def _engine_config(model: str | Path, **kwargs: Any) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    args = {"dtype": "float32", "max_model_len": MAX_MODEL_LEN, "enforce_eager": True}
    return EngineArgs(model=str(model), **args | kwargs).create_engine_config()


def test_hybrid_keeps_one_state_per_request_without_prefix_caching():
    config = _engine_config(
        model_path(GRANITE), block_size=16, enable_prefix_caching=False
    )
    cache = config.cache_config
    assert cache.mamba_cache_mode == "none"
    assert cache.mamba_block_size == MAX_MODEL_LEN
    assert cache.block_size == 16  # a 5.8 KB state page fits one fp32 block
    assert cache.mamba_page_size_padded == 2 * 16 * 64 * 4


def test_hybrid_caches_states_per_block_with_prefix_caching():
    """vLLM's default for a hybrid with prefix caching: mode "align", a state
    block per KV cache block; the Mamba2 spec asks for no in-pass checkpoint."""
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2

    from vllm_hpu.attention.state_layers import HpuMambaMixer2

    config = _engine_config(model_path(GRANITE), block_size=16)
    cache = config.cache_config
    assert cache.enable_prefix_caching
    assert cache.mamba_cache_mode == "align"
    assert cache.mamba_block_size == cache.block_size == 16
    layer = HpuMambaMixer2.__new__(HpuMambaMixer2)
    spec = MambaSpec(block_size=16, shapes=((3, 8),), dtypes=(torch.float32,))
    with patch.object(MambaMixer2, "get_kv_cache_spec", return_value=spec):
        ours = layer.get_kv_cache_spec(config)
    assert ours.num_prefill_checkpoint_blocks == 0
    assert ours.prefill_checkpoint_alignment is None


NGRAM = {"method": "ngram", "num_speculative_tokens": 2}
REFUSED = [
    ({"mamba_block_size": 64}, "--mamba-block-size"),
    ({"prefix_match_unit": 8}, "--prefix-match-unit"),
    ({"disable_hybrid_kv_cache_manager": True}, "--disable-hybrid-kv-cache-manager"),
    ({"pipeline_parallel_size": 2}, "pipeline or data parallelism"),
    (
        {"speculative_config": NGRAM, "enable_prefix_caching": True},
        "prefix caching with speculative decoding",
    ),
]


@pytest.mark.parametrize(("kwargs", "feature"), REFUSED)
def test_hybrid_refuses_unsupported_options(kwargs, feature):
    with pytest.raises(ValueError, match=rf"{feature}.*hybrid models"):
        _engine_config(model_path(GRANITE), **kwargs)


def test_hybrid_drafts_keep_the_hybrid_manager_without_prefix_caching(vllm_log):
    """n-gram drafts: prefix caching (vLLM's default) turned off, one state
    per request, and the hybrid KV cache manager kept for the state layers'
    groups; drafts of another kind are refused by name."""
    from vllm_hpu.config.hybrid import configure_hybrid
    from vllm_hpu.platform import HpuPlatform

    config = _engine_config(
        model_path(GRANITE), block_size=16, speculative_config=NGRAM
    )
    cache = config.cache_config
    assert not cache.enable_prefix_caching
    assert cache.mamba_cache_mode == "none"
    assert not config.scheduler_config.disable_hybrid_kv_cache_manager
    assert any("Prefix caching off" in m for m in vllm_log.messages())
    config.speculative_config.method = "draft_model"
    with pytest.raises(ValueError, match="other than n-gram and MTP drafts"):
        configure_hybrid(config, HpuPlatform)


@pytest.mark.parametrize(
    ("name", "draft"),
    [("tiny-qwen3.5-mtp", "Qwen3_5MTP"), ("tiny-qwen3.5-moe-mtp", "Qwen3_5MoeMTP")],
)
def test_qwen3_5_takes_its_own_mtp_layer(name: str, draft: str):
    """Qwen3.5's MTP layer drafts on its hybrid target as n-gram drafts do:
    prefix caching off, the hybrid KV cache manager kept (the MTP layer joins
    the attention group)."""
    config = _engine_config(
        model_path(name),
        block_size=16,
        speculative_config={"method": "mtp", "num_speculative_tokens": 2},
    )
    assert config.speculative_config.draft_model_config.architectures == [draft]
    assert not config.cache_config.enable_prefix_caching
    assert not config.scheduler_config.disable_hybrid_kv_cache_manager


def test_hybrid_takes_sleep_mode_lora_and_tensor_parallelism():
    config = _engine_config(
        model_path(GRANITE),
        enable_sleep_mode=True,
        enable_lora=True,
        tensor_parallel_size=2,
    )
    assert config.model_config.enable_sleep_mode and config.lora_config is not None


def test_block_grows_to_hold_a_larger_state_page(tmp_path):
    """A state page larger than a 16-token block (d_state 64: 35 KB): the block
    grows before the runner exists, and vLLM's own post-load alignment, run
    again on the result, changes nothing."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from vllm_hpu.attention.backend import HpuAttentionBackend
    from vllm_hpu.platform import HpuPlatform

    model = tmp_path / "granite-d64"
    shutil.copytree(model_path(GRANITE), model)
    config_file = model / "config.json"
    hf_config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps(hf_config | {"mamba_d_state": 64}))
    config = _engine_config(model, block_size=16)
    cache = config.cache_config
    attention_page = FullAttentionSpec(
        block_size=cache.block_size,
        num_kv_heads=4,
        head_size=16,
        dtype=config.model_config.dtype,
    ).page_size_bytes
    assert cache.block_size > 16
    assert cache.mamba_page_size_padded == attention_page
    before = (cache.block_size, cache.mamba_page_size_padded)
    HpuPlatform._align_hybrid_block_size(config, HpuAttentionBackend)
    assert (cache.block_size, cache.mamba_page_size_padded) == before
