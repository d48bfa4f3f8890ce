"""The plugin's environment table: parsing, defaults and clear errors."""

import pathlib

import pytest

from vllm_hpu.envs import HpuEnvs, read_envs, unknown_vllm_variables, variable_names


def test_envs_defaults_when_unset():
    envs = read_envs({})
    assert envs == HpuEnvs()
    assert envs.graph_reserved_mem == 0.1
    assert envs.graph_prompt_ratio == 0.3
    assert envs.skip_warmup is False
    assert envs.prompt_bs_bucket_min is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("1", True), ("true", True), ("YES", True), ("0", False), ("off", False)],
)
def test_envs_bool_values(raw, expected):
    assert read_envs({"VLLM_SKIP_WARMUP": raw}).skip_warmup is expected


def test_envs_empty_value_means_unset():
    assert read_envs({"VLLM_GRAPH_RESERVED_MEM": ""}).graph_reserved_mem == 0.1


@pytest.mark.parametrize(
    ("name", "raw", "accepted"),
    [
        ("VLLM_GRAPH_RESERVED_MEM", "abc", "a number between 0 and 1"),
        ("VLLM_GRAPH_RESERVED_MEM", "1.5", "a number between 0 and 1"),
        ("VLLM_SKIP_WARMUP", "maybe", "one of 1/true/yes/on/0/false/no/off"),
        ("VLLM_PROMPT_BS_BUCKET_MIN", "-4", "a positive integer"),
        ("VLLM_PROMPT_SEQ_BUCKET_STEP", "x", "a positive integer"),
        ("VLLM_GRAPH_DECODE_STRATEGY", "fastest", "one of min_tokens, max_bs"),
        ("VLLM_HPU_EMULATION_MEMORY_GB", "0", "a positive number"),
    ],
)
def test_envs_malformed_value_names_variable_and_accepted_values(name, raw, accepted):
    with pytest.raises(ValueError) as error:
        read_envs({name: raw})
    assert name in str(error.value)
    assert repr(raw) in str(error.value)
    assert accepted in str(error.value)


def test_envs_integer_knobs_parse():
    envs = read_envs({"VLLM_DECODE_BLOCK_BUCKET_MAX": "2048", "PT_HPU_LAZY_MODE": "1"})
    assert envs.decode_block_bucket_max == 2048
    assert envs.pt_hpu_lazy_mode == "1"


def test_envs_documented_gaudi_names_are_declared():
    names = set(variable_names())
    for phase, dim in [
        ("PROMPT", "BS"),
        ("PROMPT", "SEQ"),
        ("DECODE", "BS"),
        ("DECODE", "BLOCK"),
    ]:
        for part in ("MIN", "STEP", "MAX"):
            assert f"VLLM_{phase}_{dim}_BUCKET_{part}" in names
    for name in [
        "VLLM_GRAPH_RESERVED_MEM",
        "VLLM_GRAPH_PROMPT_RATIO",
        "VLLM_GRAPH_PROMPT_STRATEGY",
        "VLLM_GRAPH_DECODE_STRATEGY",
        "VLLM_SKIP_WARMUP",
        "VLLM_EXPONENTIAL_BUCKETING",
        "VLLM_HPU_EMULATION",
    ]:
        assert name in names


def test_envs_unknown_vllm_variables_leave_ours_out():
    environ = {
        "VLLM_SKIP_WARMUP": "1",
        "VLLM_TYPO_VAR": "1",
        "VLLM_USE_V1": "1",
        "PATH": "/",
    }
    assert unknown_vllm_variables(environ, known={"VLLM_USE_V1"}) == ["VLLM_TYPO_VAR"]


def test_envs_every_variable_is_in_the_gaudi_readme_table():
    readme = (pathlib.Path(__file__).parents[2] / "README_GAUDI.md").read_text()
    rows = {
        line.split("`")[1] for line in readme.splitlines() if line.startswith("| `")
    }
    bucket_knobs = {n for n in variable_names() if "_BUCKET_" in n}
    assert set(variable_names()) - bucket_knobs <= rows
