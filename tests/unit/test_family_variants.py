"""Variants of gpt-oss and Llama 4 the plugin cannot run are refused from their
config alone (before an engine starts); the variants it runs pass. gpt-oss's own
MXFP4 checkpoints are refused at start-up by name."""

import json
import shutil

import pytest
from models import model_path
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
