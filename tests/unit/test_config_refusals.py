"""Features the plugin refuses are read from a model's config alone (so the
caller's process can refuse them before an engine starts); the variants of
gpt-oss and Llama 4 it runs pass. gpt-oss's own MXFP4 checkpoints are refused at
start-up by name."""

import json
import shutil

import pytest
import transformers
from models import model_path

from vllm_hpu.model_support import config_feature_reason

CASES = [
    (
        "GraniteForCausalLM",
        transformers.GraniteConfig(attention_sinks=True),
        "attention sinks outside gpt-oss",
    ),
    (
        "GptOssForCausalLM",
        transformers.GptOssConfig(swiglu_limit=5.0),
        "swiglu_limit 7.0",
    ),
    (
        "GptOssForCausalLM",
        transformers.GptOssConfig(swiglu_alpha=1.0),
        "swiglu_alpha 1.702",
    ),
    (
        "Llama4ForCausalLM",
        transformers.Llama4TextConfig(num_experts_per_tok=2),
        "input of several experts",
    ),
    ("LongcatFlashForCausalLM", transformers.LongcatFlashConfig(), "zero experts"),
]
ACCEPTED = [
    ("LlamaForCausalLM", transformers.LlamaConfig()),
    ("GraniteForCausalLM", transformers.GraniteConfig()),
    ("MixtralForCausalLM", transformers.MixtralConfig()),
    ("GptOssForCausalLM", transformers.GptOssConfig()),  # sinks, clamped SwiGLU
    ("Llama4ForCausalLM", transformers.Llama4TextConfig()),  # top-1, chunked, NoPE
    (
        "Llama4ForCausalLM",
        transformers.Llama4TextConfig(num_experts_per_tok=2, num_local_experts=0),
    ),
]


@pytest.mark.parametrize(("architecture", "config", "feature"), CASES)
def test_config_feature_is_refused_with_its_name(architecture, config, feature):
    reason = config_feature_reason(architecture, config)
    assert reason is not None
    assert reason.startswith(f"{architecture} uses ")
    assert feature in reason
    assert "use a" in reason  # names what to run instead


@pytest.mark.parametrize(("architecture", "config"), ACCEPTED)
def test_config_without_those_features_passes(architecture, config):
    assert config_feature_reason(architecture, config) is None


def test_gpt_oss_mxfp4_checkpoint_is_refused_at_start_up(tmp_path):
    """gpt-oss as OpenAI ships it (MXFP4 experts, quant_method 'mxfp4'): refused
    from its config alone, naming the bf16 checkpoint that runs."""
    from vllm.engine.arg_utils import EngineArgs

    model = tmp_path / "gpt-oss-mxfp4"
    shutil.copytree(model_path("tiny-gpt-oss"), model)
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"],
    }
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"gpt-oss's own MXFP4 checkpoints.*bf16"):
        EngineArgs(model=str(model), enforce_eager=True).create_engine_config()
