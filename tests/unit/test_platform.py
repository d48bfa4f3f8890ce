"""Discovery and config fix-ups of HpuPlatform, in emulation and without it."""

import importlib.metadata
import logging
import os
import subprocess
import sys

import pytest
from models import model_path

import vllm_hpu
from vllm_hpu import envs


def _entry_point(group: str, name: str) -> importlib.metadata.EntryPoint:
    (entry,) = [
        e for e in importlib.metadata.entry_points(group=group) if e.name == name
    ]
    return entry


def test_platform_entry_points_resolve():
    assert _entry_point("vllm.platform_plugins", "hpu").load() is vllm_hpu.register
    assert (
        _entry_point("vllm.general_plugins", "hpu_ops").load() is vllm_hpu.register_ops
    )


def _current_platforms(environments: list[dict[str, str]]) -> list[str]:
    """vLLM's current platform in a fresh process per environment (started
    together: each spends seconds importing vLLM)."""
    code = (
        "from vllm.platforms import current_platform; "
        "print(type(current_platform).__name__)"
    )
    children = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for env in environments
    ]
    names = []
    for child in children:
        out, err = child.communicate()
        assert child.returncode == 0, err
        names.append(out.strip().splitlines()[-1])
    return names


@pytest.mark.slow  # two fresh processes import vLLM
def test_platform_active_only_when_emulation_is_asked_for():
    """Asked for, and left unset (VLLM_HPU_EMULATION=0 is checked in-process
    below: each fresh process spends seconds importing vLLM)."""
    base = {k: v for k, v in os.environ.items() if k != "VLLM_HPU_EMULATION"}
    on, unset = _current_platforms([{**base, "VLLM_HPU_EMULATION": "1"}, base])
    assert on == "HpuPlatform"
    assert unset != "HpuPlatform"


@pytest.fixture
def fresh_envs():
    envs.get_envs.cache_clear()
    yield
    envs.get_envs.cache_clear()


@pytest.mark.parametrize("switch", [None, "0"])
def test_platform_register_returns_none_without_switch(
    switch, monkeypatch, fresh_envs, vllm_log
):
    monkeypatch.delenv("VLLM_HPU_EMULATION")
    if switch is not None:
        monkeypatch.setenv("VLLM_HPU_EMULATION", switch)
    vllm_hpu._say_why_inactive.cache_clear()
    assert vllm_hpu.register() is None
    assert vllm_hpu.register() is None
    (hint,) = [m for m in vllm_log.messages() if "HPU platform is off" in m]
    assert "set VLLM_HPU_EMULATION=1" in hint
    envs.get_envs.cache_clear()
    monkeypatch.setenv("VLLM_HPU_EMULATION", "1")
    assert vllm_hpu.register() == vllm_hpu.PLATFORM_CLS


def _engine_config(**kwargs):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=model_path("tiny-llama"), **kwargs).create_engine_config()


def test_platform_config_fixups_defaults():
    from vllm.config import CompilationMode, CUDAGraphMode

    config = _engine_config(dtype="float32")
    assert config.parallel_config.worker_cls == "vllm_hpu.worker.hpu_worker.HpuWorker"
    assert config.cache_config.block_size == 128
    assert config.compilation_config.mode == CompilationMode.NONE
    assert config.compilation_config.cudagraph_mode == CUDAGraphMode.NONE
    assert config.compilation_config.custom_ops == ["all"]
    assert config.scheduler_config.async_scheduling is True
    assert config.model_config.dtype.__repr__() == "torch.float32"


def test_platform_respects_user_block_size():
    assert _engine_config(block_size=16).cache_config.block_size == 16


def test_platform_rejects_unsupported_features_at_startup():
    with pytest.raises(ValueError, match="does not run the KV connector"):
        _engine_config(
            kv_transfer_config={
                "kv_connector": "ExampleConnector",
                "kv_role": "kv_both",
            }
        )
    with pytest.raises(ValueError, match="--kv-sharing-fast-prefill"):
        _engine_config(kv_sharing_fast_prefill=True)


def test_platform_offers_sleep_mode_and_refuses_it_with_a_draft_model():
    assert _engine_config(enable_sleep_mode=True).model_config.enable_sleep_mode
    draft = {"method": "ngram", "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match="weight transfer with a draft model"):
        _engine_config(enable_sleep_mode=True, speculative_config=draft)
    with pytest.raises(ValueError, match="sleep mode with a KV connector"):
        nixl = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
        _engine_config(enable_sleep_mode=True, kv_transfer_config=nixl)


def test_platform_owned_variables_are_not_reported_unknown(monkeypatch, vllm_log):
    from vllm.platforms import current_platform

    monkeypatch.setenv("VLLM_SKIP_WARMUP", "true")
    monkeypatch.setenv("VLLM_NOT_A_REAL_VARIABLE", "1")
    current_platform.validate_environ(hard_fail=False)
    assert vllm_log.messages(logging.WARNING) == [
        "Unknown vLLM environment variable detected: VLLM_NOT_A_REAL_VARIABLE"
    ]
    with pytest.raises(ValueError, match="VLLM_NOT_A_REAL_VARIABLE"):
        current_platform.validate_environ(hard_fail=True)
    monkeypatch.delenv("VLLM_NOT_A_REAL_VARIABLE")
    current_platform.validate_environ(hard_fail=True)
