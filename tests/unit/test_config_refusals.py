"""Features the plugin refuses are read from a model's config alone (so the
caller's process can refuse them before an engine starts)."""

import pytest
import transformers

from vllm_hpu.model_support import config_feature_reason

CASES = [
    ("GptOssForCausalLM", transformers.GptOssConfig(), "attention sinks"),
    (
        "GraniteForCausalLM",
        transformers.GraniteConfig(attention_sinks=True),
        "attention sinks",
    ),
    ("Llama4ForCausalLM", transformers.Llama4TextConfig(), "chunked local attention"),
    (
        "Llama4ForCausalLM",
        transformers.Llama4TextConfig(attention_chunk_size=None),
        "routing weights applied to the experts' input",
    ),
    ("LongcatFlashForCausalLM", transformers.LongcatFlashConfig(), "zero experts"),
]
ACCEPTED = [
    ("LlamaForCausalLM", transformers.LlamaConfig()),
    ("GraniteForCausalLM", transformers.GraniteConfig()),
    ("MixtralForCausalLM", transformers.MixtralConfig()),
    (
        "Llama4ForCausalLM",
        transformers.Llama4TextConfig(attention_chunk_size=None, num_local_experts=0),
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
