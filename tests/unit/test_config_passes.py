"""The platform's config hooks give the same config when vLLM runs them again.

vLLM's default engine runs ``VllmConfig.__post_init__`` a second time in the
engine core, on the config the caller's pass built (tests/config_passes.py). A
hook that re-derives its decision there from fields the first pass changed
refuses, in the core, what the caller accepted (issue 50: the core died after
its handshake and ``LLM(...)`` waited forever). Each configuration the suite's
end-to-end tests start an engine or a server with (their ``LLM`` arguments and
plugin variables, one per feature) is built here as vLLM builds it, and the
core's pass over it must change nothing and raise nothing. The harness runs
the same check on every in-process engine the suite starts.
"""

import json
from typing import Any

import pytest
from config_passes import engine_core_pass
from models import model_path

pytestmark = pytest.mark.slow  # vLLM inspects each new architecture in a process

SMALL = {"dtype": "float32", "max_model_len": 256, "kv_cache_memory_bytes": 64 << 20}
COMPILED = {"VLLM_HPU_COMPILE_BACKEND": "eager"}
NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}

# (test id, model, EngineArgs keywords, plugin variables)
# INC's unit scales quantize the KV cache too: its dtype says so.
INC = {"dtype": "bfloat16", "kv_cache_dtype": "fp8_inc"}

CONFIGURATIONS: list[tuple[str, str, dict[str, Any], dict[str, str]]] = [
    ("plain", "tiny-llama", {}, {}),
    ("dtype-auto", "tiny-llama", {"dtype": "auto"}, {}),
    (
        "prefix-caching",
        "tiny-llama",
        {"block_size": 16, "enable_prefix_caching": True},
        {},
    ),
    (
        "chunked",
        "tiny-llama",
        {"max_num_batched_tokens": 64, "enable_chunked_prefill": True},
        {},
    ),
    ("async-off", "tiny-llama", {"async_scheduling": False}, {}),
    ("async-by-variable", "tiny-llama", {}, {"VLLM_DELAYED_SAMPLING": "false"}),
    ("compiled", "tiny-llama", {"enforce_eager": False}, COMPILED),
    ("O0", "tiny-llama", {"optimization_level": 0}, {}),
    ("kv-offloading", "tiny-llama", {"block_size": 16, "kv_offloading_size": 0.05}, {}),
    ("kv-offloading-windows", "tiny-mistral-sw", {"kv_offloading_size": 0.05}, {}),
    ("nixl", "tiny-llama", {"kv_transfer_config": NIXL}, {}),
    ("ngram", "tiny-llama", {"speculative_config": NGRAM}, {}),
    (
        "draft",
        "tiny-llama",
        {
            "speculative_config": {
                "model": "tiny-llama-draft",
                "num_speculative_tokens": 2,
            }
        },
        {},
    ),
    (
        "eagle",
        "tiny-llama",
        {
            "speculative_config": {
                "method": "eagle",
                "model": "tiny-llama-eagle",
                "num_speculative_tokens": 2,
            }
        },
        {},
    ),
    (
        "eagle3",
        "tiny-llama",
        {
            "speculative_config": {
                "method": "eagle3",
                "model": "tiny-llama-eagle3",
                "num_speculative_tokens": 2,
            }
        },
        {},
    ),
    ("lora", "tiny-llama", {"enable_lora": True, "max_lora_rank": 8}, {}),
    ("sleep-mode", "tiny-llama", {"enable_sleep_mode": True}, {}),
    (
        "weight-transfer",
        "tiny-llama",
        {"weight_transfer_config": {"backend": "hpu"}},
        {},
    ),
    ("fp8-kv-cache", "tiny-llama", {"kv_cache_dtype": "fp8"}, {}),
    (
        "tp2",
        "tiny-llama",
        {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"},
        {},
    ),
    (
        "pp2",
        "tiny-llama",
        {"pipeline_parallel_size": 2, "distributed_executor_backend": "mp"},
        {},
    ),
    (
        "dp2-moe-ep",
        "tiny-qwen3-moe",
        {"data_parallel_size": 2, "enable_expert_parallel": True},
        {},
    ),
    ("pooling", "tiny-llama", {"runner": "pooling"}, {}),
    ("classify", "tiny-llama-classify", {"runner": "pooling"}, {}),
    ("windows", "tiny-gemma2", {}, {}),
    (
        "windows-hma-off",
        "tiny-mistral-sw",
        {"disable_hybrid_kv_cache_manager": True},
        {},
    ),
    ("windows-spec", "tiny-mistral-sw", {"speculative_config": NGRAM}, {}),
    ("gpt-oss", "tiny-gpt-oss", {}, {}),
    ("gpt-oss-mxfp4", "tiny-gpt-oss-mxfp4", {"dtype": "bfloat16"}, {}),
    ("llama4-chunked", "tiny-llama4", {}, {}),
    ("mla", "tiny-deepseek-v2", {}, {}),
    ("moe", "tiny-mixtral", {}, {}),
    ("hybrid-mamba", "tiny-granite-4.0-h", {"enable_prefix_caching": True}, COMPILED),
    ("hybrid-no-prefix", "tiny-qwen3-next", {"enable_prefix_caching": False}, {}),
    ("fp8-block", "tiny-llama-ct-fp8-block", {"dtype": "bfloat16"}, {}),
    ("w4a16", "tiny-qwen2-ct-w4a16-asym-g64", {"dtype": "bfloat16"}, {}),
    ("online-fp8", "tiny-llama", {"quantization": "fp8", "dtype": "bfloat16"}, {}),
    ("llava", "tiny-llava", {"limit_mm_per_prompt": {"image": 2}}, {}),
    (
        "qwen2-vl",
        "tiny-qwen2-vl",
        {"limit_mm_per_prompt": {"image": 2, "video": 0}},
        {},
    ),
    ("llama4-vision", "tiny-llama4-vision", {}, COMPILED),
    # QUANT_CONFIG alone asks for INC's flow (the platform names the method).
    ("inc-unit-scale", "tiny-llama", INC, {"QUANT_CONFIG": "{inc}"}),
    ("inc", "tiny-llama", {**INC, "quantization": "inc"}, {"QUANT_CONFIG": "{inc}"}),
]


def _model_paths(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A speculative config's draft named by its tiny model's name, as a path."""
    speculative = kwargs.get("speculative_config")
    if speculative and "model" in speculative:
        speculative = {**speculative, "model": model_path(speculative["model"])}
        kwargs = {**kwargs, "speculative_config": speculative}
    return kwargs


@pytest.mark.parametrize(
    ("model", "kwargs", "env"),
    [pytest.param(m, k, e, id=name) for name, m, k, e in CONFIGURATIONS],
)
def test_engine_core_pass_changes_nothing(hpu_env, tmp_path, model, kwargs, env):
    from vllm.engine.arg_utils import EngineArgs

    inc = tmp_path / "unit_scale.json"
    unit_scale = {"mode": "QUANTIZE", "scale_method": "unit_scale"}
    inc.write_text(json.dumps({**unit_scale, "dump_stats_path": str(tmp_path)}))
    hpu_env(**{name: value.format(inc=inc) for name, value in env.items()})
    args = EngineArgs(model=model_path(model), **(SMALL | _model_paths(kwargs)))
    config = args.create_engine_config()
    assert engine_core_pass(config) == {}


def test_refusals_happen_in_the_callers_pass():
    """What the runner cannot run is refused while the caller builds the
    config, once vLLM has derived the KV connector the refusal depends on."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=model_path("tiny-mistral-sw"),
        disable_hybrid_kv_cache_manager=False,
        kv_offloading_size=0.05,
        **SMALL,
    )
    with pytest.raises(ValueError, match="drop --no-disable-hybrid-kv-cache-manager"):
        args.create_engine_config()


def test_the_record_travels_with_the_config():
    """What the user asked is in the config's additional_config, as JSON."""
    from vllm.engine.arg_utils import EngineArgs

    from vllm_hpu.patches import engine_args

    config = EngineArgs(model=model_path("tiny-llama"), **SMALL).create_engine_config()
    recorded = config.additional_config[engine_args.REQUESTED]
    assert json.loads(json.dumps(recorded)) == recorded
    assert engine_args.requested_options(config).dtype_auto is False
    assert "async scheduling" in config.additional_config[engine_args.DECIDED]
