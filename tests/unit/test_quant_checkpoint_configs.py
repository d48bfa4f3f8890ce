"""Which quantized checkpoints start: compressed-tensors schemes the plugin runs
pass the platform's config check; every other variant is refused there, at
start-up in the caller's process, with the variant named."""

import json
import shutil

import pytest
import torch
from models import model_path
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (  # noqa: E501
    CompressedTensorsConfig,
)

from vllm_hpu.platform import HpuPlatform
from vllm_hpu.quantization.checkpoints import check_quant_config

FP8 = {"num_bits": 8, "type": "float", "symmetric": True}
INT8 = {"num_bits": 8, "type": "int", "symmetric": True}
INT4 = {"num_bits": 4, "type": "int", "symmetric": True}
FP4 = {"num_bits": 4, "type": "float", "symmetric": True}


def ct_config(
    weights: dict, inputs: dict | None, fmt: str, **extra: object
) -> dict[str, object]:
    group = {"targets": ["Linear"], "weights": weights, "input_activations": inputs}
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "config_groups": {"group_0": group | extra},
        "ignore": ["lm_head"],
    }


SUPPORTED = {
    "fp8-dynamic": ct_config(
        FP8 | {"strategy": "channel"},
        FP8 | {"strategy": "token", "dynamic": True},
        "float-quantized",
    ),
    "fp8-static": ct_config(
        FP8 | {"strategy": "tensor"}, FP8 | {"strategy": "tensor"}, "float-quantized"
    ),
    "fp8-block": ct_config(
        FP8 | {"strategy": "block", "block_structure": [128, 128]},
        FP8 | {"strategy": "group", "group_size": 128, "dynamic": True},
        "float-quantized",
    ),
    "w8a8-int8": ct_config(
        INT8 | {"strategy": "channel"},
        INT8 | {"strategy": "token", "dynamic": True},
        "int-quantized",
    ),
    "w4a16-asym": ct_config(
        INT4 | {"strategy": "group", "group_size": 64, "symmetric": False},
        None,
        "pack-quantized",
    ),
    "w8a16-channel": ct_config(INT8 | {"strategy": "channel"}, None, "pack-quantized"),
    "mxfp4a16": ct_config(
        FP4 | {"strategy": "group", "group_size": 32}, None, "mxfp4-pack-quantized"
    ),
}

REFUSED = {
    "int4 group 128, activations int8 dynamic token": ct_config(
        INT4 | {"strategy": "group", "group_size": 128},
        INT8 | {"strategy": "token", "dynamic": True},
        "int-quantized",
    ),
    "activations int8 dynamic token asymmetric": ct_config(
        INT8 | {"strategy": "channel"},
        INT8 | {"strategy": "token", "dynamic": True, "symmetric": False},
        "int-quantized",
    ),
    "weights float8 channel, activations not quantized": ct_config(
        FP8 | {"strategy": "channel"}, None, "float-quantized"
    ),
    "weights float4 dynamic tensor_group 16": ct_config(
        FP4 | {"strategy": "tensor_group", "group_size": 16, "dynamic": "local"},
        None,
        "nvfp4-pack-quantized",
    ),
    "activations float4 dynamic group 32": ct_config(
        FP4 | {"strategy": "group", "group_size": 32},
        FP4 | {"strategy": "group", "group_size": 32, "dynamic": True},
        "mxfp4-pack-quantized",
    ),
    "weights int3 group 128": ct_config(
        {"num_bits": 3, "type": "int", "strategy": "group", "group_size": 128},
        None,
        "pack-quantized",
    ),
    "outputs float8 tensor": ct_config(
        FP8 | {"strategy": "tensor"},
        FP8 | {"strategy": "tensor"},
        "float-quantized",
        output_activations=FP8 | {"strategy": "tensor"},
    ),
}


@pytest.mark.parametrize("name", list(SUPPORTED))
def test_schemes_the_plugin_runs_pass_the_check(name):
    check_quant_config(CompressedTensorsConfig.from_config(SUPPORTED[name]))


@pytest.mark.parametrize("named", list(REFUSED))
def test_other_schemes_are_refused_by_name(named):
    config = CompressedTensorsConfig.from_config(REFUSED[named])
    with pytest.raises(ValueError, match="is not supported on HPU") as error:
        check_quant_config(config)
    assert named in str(error.value)
    assert "'Linear'" in str(error.value)


def test_transforms_are_refused():
    config = SUPPORTED["fp8-dynamic"] | {"transform_config": {"config_groups": {}}}
    parsed = CompressedTensorsConfig.from_config(config)
    parsed.transform_config = {"config_groups": {"u": {"type": "hadamard"}}}
    with pytest.raises(ValueError, match="transforms"):
        check_quant_config(parsed)


def write_model(tmp_path, quant_config: dict) -> str:
    """tiny-llama's files (unquantized weights) under a quantization config: a
    refusal must come from the config alone, before any weight is read."""
    model = tmp_path / "model"
    shutil.copytree(model_path("tiny-llama"), model)
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = quant_config
    (model / "config.json").write_text(json.dumps(config))
    return str(model)


def test_refused_at_start_up_in_the_platform_config_check(tmp_path):
    from vllm.engine.arg_utils import EngineArgs

    named = "weights int3 group 128"
    args = EngineArgs(model=write_model(tmp_path, REFUSED[named]), enforce_eager=True)
    with pytest.raises(ValueError, match=named):
        args.create_engine_config()


def test_a_scheme_the_plugin_runs_starts_up(tmp_path):
    from vllm.engine.arg_utils import EngineArgs

    path = write_model(tmp_path, SUPPORTED["w4a16-asym"])
    config = EngineArgs(model=path, enforce_eager=True).create_engine_config()
    assert config.model_config.quantization == "compressed-tensors"


def test_platform_accepts_compressed_tensors_and_float16():
    HpuPlatform.verify_quantization("compressed-tensors")
    assert HpuPlatform().supported_dtypes[0] == torch.bfloat16
    assert torch.float16 in HpuPlatform().supported_dtypes
