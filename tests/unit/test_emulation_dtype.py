"""In emulation a dtype left to vLLM becomes the one the CPU runs fast; an
explicit one is kept. (The log line saying which: tests/e2e/test_clean_start.py.)"""

import pytest
import torch
from models import model_path

from vllm_hpu import device


def _engine_config(**kwargs):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=model_path("tiny-llama"), **kwargs).create_engine_config()


@pytest.mark.parametrize(
    ("bf16_instructions", "fast"), [(False, torch.float32), (True, torch.bfloat16)]
)
def test_auto_dtype_is_the_cpus_fast_one(monkeypatch, bf16_instructions, fast):
    monkeypatch.setattr(device, "cpu_has_bf16_instructions", lambda: bf16_instructions)
    # tiny-llama is a float32 checkpoint: vLLM alone would pick bfloat16.
    config = _engine_config(enable_lora=True)
    assert config.model_config.dtype == fast
    assert config.lora_config.lora_dtype == fast


@pytest.mark.parametrize(
    ("bf16_instructions", "dtype"), [(False, "bfloat16"), (True, "float32")]
)
def test_explicit_dtype_wins(monkeypatch, bf16_instructions, dtype):
    monkeypatch.setattr(device, "cpu_has_bf16_instructions", lambda: bf16_instructions)
    config = _engine_config(dtype=dtype)
    assert config.model_config.dtype == getattr(torch, dtype)
