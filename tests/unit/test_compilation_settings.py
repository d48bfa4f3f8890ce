"""A user's -O level and --compilation-config: honoured where the HPU runner has
the equivalent, otherwise refused or logged at start-up with the reason."""

import logging

import pytest
from models import model_path


def engine_config(**kwargs):
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=model_path("tiny-llama"), dtype="float32", **kwargs)
    return args.create_engine_config()


def test_level_zero_runs_eagerly_and_says_so(vllm_log):
    config = engine_config(optimization_level=0)
    assert config.model_config.enforce_eager
    assert any(m.startswith("-O0 (no compilation") for m in vllm_log.messages())


# (what the user passed, variables, a start of the line logged about it)
LOGGED = [
    ({"optimization_level": 3}, {}, "-O3 sets vLLM's Inductor"),
    (
        {"compilation_config": {"mode": 0}},
        {},
        "--compilation-config mode NONE: honoured",
    ),
    (
        {"compilation_config": {"mode": 1}},
        {"VLLM_HPU_COMPILE_BACKEND": "eager"},
        "--compilation-config mode STOCK_TORCH_COMPILE: honoured (torch.compile)",
    ),
    ({"compilation_config": {"mode": 3}}, {}, "--compilation-config mode VLLM_COMPILE"),
    (
        {"compilation_config": {"cudagraph_mode": "FULL"}},
        {},
        "--compilation-config cudagraph_mode FULL: the HPU runner captures no graphs",
    ),
    (
        {"compilation_config": {"cudagraph_capture_sizes": [1, 2]}},
        {},
        "--compilation-config cudagraph capture sizes do not apply",
    ),
]


@pytest.mark.parametrize(("kwargs", "variables", "line"), LOGGED)
def test_settings_the_runner_replaces_are_logged(
    kwargs, variables, line, hpu_env, vllm_log
):
    hpu_env(**variables)
    engine_config(**kwargs)
    assert any(m.startswith(line) for m in vllm_log.messages(logging.INFO))


REFUSED = [
    # torch.compile asked for where the runner runs eagerly.
    ({"mode": 1}, {}, "set VLLM_HPU_COMPILE_BACKEND"),
    # no torch.compile asked for where the runner compiles.
    ({"mode": 0}, {"VLLM_HPU_COMPILE_BACKEND": "eager"}, "mode NONE .* contradicts"),
    # no graphs asked for where the runner captures them.
    (
        {"cudagraph_mode": "NONE"},
        {"VLLM_HPU_COMPILE_BACKEND": "eager"},
        "--enforce-eager",
    ),
    # the plugin's own layer implementations switched off.
    ({"custom_ops": ["none"]}, {}, r"custom_ops \['none'\]"),
]


@pytest.mark.parametrize(("compilation", "variables", "message"), REFUSED)
def test_settings_the_runner_cannot_honour_stop_start_up(
    compilation, variables, message, hpu_env
):
    hpu_env(**variables)
    with pytest.raises(ValueError, match=message):
        engine_config(compilation_config=compilation)


def test_defaults_log_nothing_about_compilation(vllm_log):
    engine_config()
    assert not [m for m in vllm_log.messages() if "compilation-config" in m]
    assert not [m for m in vllm_log.messages() if m.startswith("-O")]


def test_a_deepseek_v32_config_leaves_later_configs_their_mode(hpu_env):
    """vLLM turns its breakable CUDA graphs on for DeepSeek-V3.2 by writing
    VLLM_USE_BREAKABLE_CUDAGRAPH=1 into the process's environment, which then
    forces mode NONE on every later config; on HPU the variable stays 0."""
    from vllm.engine.arg_utils import EngineArgs

    EngineArgs(model=model_path("tiny-deepseek-v32")).create_engine_config()
    hpu_env()
    with pytest.raises(ValueError, match="set VLLM_HPU_COMPILE_BACKEND"):
        engine_config(compilation_config={"mode": 1})
