"""The plugin on vLLM 0.32 and 0.33 (vllm_hpu/compat.py): the running vLLM is one
it knows; what 0.33 adds that the plugin does not run, and what it removed, is
refused by name when vLLM builds its config in the caller's process (as ``LLM``
and ``vllm serve`` do) on either version. `make test` runs this on the default
vLLM, `make test-other-vllm` on the other."""

import importlib.metadata
from typing import Any

import pytest
import torch
from models import model_path
from packaging.version import Version

from vllm_hpu import compat

RUNNING = Version(importlib.metadata.version("vllm"))
ON_0_33 = RUNNING.release[:2] == (0, 33)


def engine_config(**kwargs: Any) -> Any:
    """vLLM's config for tiny-llama built as ``LLM(...)`` builds it: the
    platform's start-up checks run in this process."""
    from vllm.engine.arg_utils import EngineArgs

    args = {"model": model_path("tiny-llama"), "dtype": "float32", **kwargs}
    return EngineArgs(**args).create_engine_config()


def test_the_running_vllm_is_one_the_plugin_runs_on():
    assert RUNNING.release[:2] in ((0, 32), (0, 33))
    assert compat.unsupported_vllm_version() is None
    assert compat.VLLM_0_33 == ON_0_33


def test_another_vllm_is_refused_naming_the_ones_it_runs_on(monkeypatch):
    monkeypatch.setattr(compat, "VLLM_VERSION", Version("0.34.0"))
    reason = compat.unsupported_vllm_version()
    assert reason is not None
    assert "vLLM 0.34.0: the HPU plugin runs on vLLM 0.32 and 0.33" in reason


def test_weight_sources_yield_every_parameter_whole():
    """The "hpu" weight transfer reads a trainer's module through vLLM's own
    ModuleSource, iterable on 0.32 and through iter_full() on 0.33."""
    from vllm.distributed.weight_transfer.base import ModuleSource

    module = torch.nn.Linear(3, 2)
    pairs = list(compat.weight_source_tensors(ModuleSource(module)))
    assert [name for name, _ in pairs] == ["weight", "bias"]
    torch.testing.assert_close(pairs[0][1], module.weight)


@pytest.mark.slow
@pytest.mark.other_vllm
@pytest.mark.parametrize("method", ["synthetic", "block", "fly"])
def test_rejection_methods_other_than_standard_are_refused(method):
    """vLLM 0.33 adds FLy's lossy verification; 0.32 has synthetic and block.
    The HPU rejection sampler runs the standard algorithm only."""
    spec: dict[str, Any] = {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 3,
        "rejection_sample_method": method,
    }
    if method == "synthetic":
        spec["synthetic_acceptance_length"] = 1.5
    if method == "fly" and not ON_0_33:
        with pytest.raises(ValueError, match="rejection_sample_method"):
            engine_config(speculative_config=spec)  # vLLM 0.32 knows no 'fly'
        return
    with pytest.raises(ValueError, match=f"rejection_sample_method '{method}'"):
        engine_config(speculative_config=spec)


@pytest.mark.slow
@pytest.mark.other_vllm
def test_quantized_draft_lm_head_is_refused():
    """vLLM 0.33's draft_lm_head_quantization (Model Runner V2 only) would be
    ignored by the HPU EAGLE proposer: refused by name. 0.32 has no such option
    and refuses it itself."""
    spec = {
        "method": "eagle",
        "model": model_path("tiny-llama-eagle"),
        "num_speculative_tokens": 2,
        "draft_lm_head_quantization": "fp8",
    }
    match = "draft_lm_head_quantization 'fp8'" if ON_0_33 else "draft_lm_head"
    with pytest.raises(ValueError, match=match):
        engine_config(speculative_config=spec)


@pytest.mark.slow
@pytest.mark.other_vllm
def test_elastic_expert_parallelism_is_refused():
    """vLLM 0.33 runs elastic EP under an external orchestrator too. Either way
    it needs EPLB, which the plugin runs (patches/eplb_config.py); elastic EP
    itself scales over NCCL stateless groups: the plugin refuses it by name, in
    the caller's process."""
    moe = {"model": model_path("tiny-qwen2-moe"), "enable_expert_parallel": True}
    with pytest.raises(ValueError, match="does not support elastic expert"):
        engine_config(**moe, enable_eplb=True, enable_elastic_ep=True)
    with pytest.raises(ValueError, match="Elastic EP is only supported with"):
        engine_config(**moe, enable_elastic_ep=True)


@pytest.mark.slow
@pytest.mark.other_vllm
def test_sleep_mode_backends_are_refused():
    """vLLM 0.33's --sleep-mode-backend picks a backend of its own; the HPU
    worker's sleep mode answers the sleep calls whatever it names."""
    if not ON_0_33:
        with pytest.raises(TypeError, match="sleep_mode_backend"):
            engine_config(enable_sleep_mode=True, sleep_mode_backend="xpumem")
        return
    with pytest.raises(ValueError, match="'xpumem' sleep mode backend"):
        engine_config(enable_sleep_mode=True, sleep_mode_backend="xpumem")
    assert engine_config(enable_sleep_mode=True).model_config.enable_sleep_mode


def test_xpress_drafting_is_refused_by_name():
    """XPress (vLLM 0.33) drafts under the 'dflash' method."""
    from types import SimpleNamespace

    from vllm_hpu.worker.spec_decode.methods import check_speculative_config

    config = SimpleNamespace(speculative_config=SimpleNamespace(method="dflash"))
    with pytest.raises(ValueError, match=r"'dflash'.*XPress drafting"):
        check_speculative_config(config)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.other_vllm
def test_vllm_0_32_older_ray_executor_is_refused(monkeypatch):
    """vLLM 0.33 removed the Ray executor VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0
    chose on 0.32; the plugin runs the V2 executor on both and refuses the
    variable on 0.32 (0.33 no longer reads it)."""
    import vllm.envs

    monkeypatch.setenv("VLLM_USE_RAY_V2_EXECUTOR_BACKEND", "0")
    vllm.envs.disable_envs_cache()
    assert compat.legacy_ray_executor_requested() == (not ON_0_33)
    if not ON_0_33:
        with pytest.raises(ValueError, match="VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0"):
            engine_config(distributed_executor_backend="ray")
