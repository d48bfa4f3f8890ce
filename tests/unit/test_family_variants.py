"""Variants of gpt-oss and Llama 4 the plugin cannot run are refused from their
config alone (before an engine starts); the variants it runs pass."""

import pytest
from transformers import GptOssConfig, Llama4TextConfig

from vllm_hpu.model_support import family_variant_reason

REFUSED = [
    ("GptOssForCausalLM", GptOssConfig(swiglu_limit=5.0), "swiglu_limit 7.0"),
    ("GptOssForCausalLM", GptOssConfig(swiglu_alpha=1.0), "swiglu_alpha 1.702"),
    (
        "Llama4ForCausalLM",
        Llama4TextConfig(num_experts_per_tok=2),
        "input of several experts",
    ),
]
ACCEPTED = [
    ("GptOssForCausalLM", GptOssConfig()),
    ("Llama4ForCausalLM", Llama4TextConfig()),  # top-1, chunked, NoPE layers
    ("Llama4ForCausalLM", Llama4TextConfig(num_experts_per_tok=2, num_local_experts=0)),
]


@pytest.mark.parametrize(("architecture", "config", "named"), REFUSED)
def test_family_variant_is_refused_naming_it(architecture, config, named):
    reason = family_variant_reason(architecture, config)
    assert reason is not None and reason.startswith(f"{architecture} uses ")
    assert named in reason and "use a" in reason


@pytest.mark.parametrize(("architecture", "config"), ACCEPTED)
def test_family_the_plugin_runs_passes(architecture, config):
    assert family_variant_reason(architecture, config) is None
