"""Features the plugin refuses are read from a model's config alone (so the
caller's process can refuse them before an engine starts); the variants of
gpt-oss and Llama 4 it runs pass. gpt-oss's own MXFP4 checkpoints pass; an
'mxfp4' checkpoint of another model is refused at start-up by name, and so is
--quantization asking for MXFP4 weights a bf16 checkpoint does not hold."""

import json
import shutil

import pytest
import transformers
from models import model_path

from vllm_hpu.config.model_support import config_feature_reason

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
    (
        "GlmMoeDsaForCausalLM",
        transformers.GlmMoeDsaConfig(),
        "sparse attention other than DeepSeek-V3.2's",
    ),
    (
        "DeepseekV32ForCausalLM",
        transformers.DeepseekV32Config(index_topk_pattern="FSSFSS"),
        "every layer's indexer",
    ),
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
    ("DeepseekV32ForCausalLM", transformers.DeepseekV32Config()),  # sparse MLA
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


def with_mxfp4_config(name: str, tmp_path) -> str:  # type: ignore[no-untyped-def]
    """The tiny model ``name`` with OpenAI's MXFP4 quantization_config."""
    model = tmp_path / f"{name}-mxfp4"
    shutil.copytree(model_path(name), model)
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"],
    }
    (model / "config.json").write_text(json.dumps(config))
    return str(model)


def test_gpt_oss_mxfp4_checkpoint_passes_and_other_mxfp4_is_refused(tmp_path):
    """gpt-oss as OpenAI ships it (quant_method 'mxfp4') runs, as vLLM's
    'gpt_oss_mxfp4'; the same config on another model is refused from its config
    alone, naming what runs."""
    from vllm.engine.arg_utils import EngineArgs

    gpt_oss = with_mxfp4_config("tiny-gpt-oss", tmp_path)
    config = EngineArgs(model=gpt_oss, enforce_eager=True).create_engine_config()
    assert config.model_config.quantization == "gpt_oss_mxfp4"
    llama = with_mxfp4_config("tiny-llama", tmp_path)
    with pytest.raises(ValueError, match=r"only as gpt-oss's own MXFP4 checkpoints"):
        EngineArgs(model=llama, enforce_eager=True).create_engine_config()


@pytest.mark.parametrize(
    ("method", "refusal"),
    [
        ("mxfp4", r"for a bf16 gpt-oss checkpoint, drop --quantization"),
        ("gpt_oss_mxfp4", r"config.json has no quantization_config"),
    ],
)
def test_mxfp4_asked_of_a_bf16_checkpoint_is_refused(method, refusal):
    """Nothing quantizes to MXFP4 at load: --quantization mxfp4 (vLLM's name)
    or gpt_oss_mxfp4 on bf16 gpt-oss would load its bf16 experts into MXFP4
    parameters; both stop before an engine starts, saying to drop the flag."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=model_path("tiny-gpt-oss"), enforce_eager=True, quantization=method
    )
    with pytest.raises(ValueError, match=refusal):
        args.create_engine_config()


def test_eplb_is_accepted_and_completed_as_vllm_completes_it():
    """vLLM 0.32 refuses --enable-eplb outside CUDA, ROCm and XPU; on the HPU
    platform the config gets it with the user's EPLB settings, gloo weight
    exchange and synchronous rearrangement, and keeps vLLM's own checks."""
    from vllm.engine.arg_utils import EngineArgs

    def config(**kwargs):  # type: ignore[no-untyped-def]
        args = EngineArgs(
            model=model_path("tiny-mixtral"),
            enforce_eager=True,
            enable_eplb=True,
            eplb_config={"num_redundant_experts": 2, "step_interval": 5},
            **kwargs,
        )
        return args.create_engine_config().parallel_config

    parallel = config(tensor_parallel_size=2, enable_expert_parallel=True)
    assert parallel.enable_eplb
    eplb = parallel.eplb_config
    assert (eplb.num_redundant_experts, eplb.step_interval) == (2, 5)
    assert (eplb.communicator, eplb.use_async) == ("torch_gloo", False)
    with pytest.raises(ValueError, match="enable_expert_parallel must be True"):
        config(tensor_parallel_size=2)
    with pytest.raises(ValueError, match="EPLB requires tensor"):
        config(enable_expert_parallel=True)
    with pytest.raises(ValueError, match="elastic expert parallelism"):
        config(
            tensor_parallel_size=2, enable_expert_parallel=True, enable_elastic_ep=True
        )


def test_routed_experts_with_drafts_are_refused():
    """Drafts' rows of routed experts would need the verification's acceptance
    counts: enable_return_routed_experts with speculative decoding is refused
    at start-up by name."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=model_path("tiny-mixtral"),
        enforce_eager=True,
        enable_return_routed_experts=True,
        speculative_config={"method": "ngram", "num_speculative_tokens": 2},
    )
    with pytest.raises(ValueError, match="routed experts returned"):
        args.create_engine_config()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"tensor_parallel_size": 2}, "tensor, pipeline or data parallelism"),
        (
            {"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}},
            "speculative decoding",
        ),
    ],
    ids=["tensor-parallel", "speculative"],
)
def test_sparse_attention_refuses_what_it_has_not_run_with(options, named):
    """DeepSeek-V3.2's sparse attention stops start-up, naming the option, with
    what no test has run it with."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=model_path("tiny-deepseek-v32"), enforce_eager=True, **options
    )
    with pytest.raises(ValueError, match=f"sparse attention with {named}"):
        args.create_engine_config()
