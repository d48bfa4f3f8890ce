"""A model the plugin refuses from its config is refused in the caller's process:
``LLM(...)`` in vLLM's default mode (the engine in its own process) raises the
reason itself, not "Engine core initialization failed. See root cause above"."""

import shutil
from pathlib import Path

import pytest
import torch
from models import model_path


def write_tiny_gpt_oss(out_dir: Path) -> None:
    """A random two-layer gpt-oss (attention sinks in every layer, four experts)
    with tiny-llama's tokenizer."""
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(
        vocab_size=1024,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=32,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    GptOssForCausalLM(config).save_pretrained(out_dir)
    tokenizer_dir = Path(model_path("tiny-llama"))
    for tokenizer_file in tokenizer_dir.glob("tokenizer*"):
        shutil.copy(tokenizer_file, out_dir)


def test_config_refusal_reaches_the_caller_of_a_multiprocess_engine(
    tmp_path, monkeypatch
):
    import vllm.envs
    from vllm import LLM

    write_tiny_gpt_oss(tmp_path)
    # vLLM's default; the e2e harness runs engines in this process instead.
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    vllm.envs.disable_envs_cache()  # an earlier in-process engine cached "0"
    with pytest.raises(ValueError, match="uses attention sinks") as refusal:
        LLM(model=str(tmp_path), dtype="float32", max_model_len=256)
    assert "use a model without attention sinks" in str(refusal.value)
