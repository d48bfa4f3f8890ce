"""Every architecture in vLLM's registry is either runnable here or refused at
start-up with the missing piece named; the platform step refuses before loading."""

import collections
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from models import model_path
from vllm.model_executor.models.registry import ModelRegistry, _ModelInfo

from vllm_hpu.config import refusals
from vllm_hpu.config.model_support import (
    FED_MULTIMODAL_ARCHS,
    MISSING_ARCHS,
    RUNNABLE_HYBRID_ARCHS,
    unsupported_reason,
)

# Imports every model module of vLLM once, in a child process so that what the
# modules register (configs, custom ops) stays out of the test process; an
# architecture whose module cannot even be imported here (torchvision, CUDA
# kernels) is one vLLM itself refuses on this machine.
_WALK = """
import dataclasses, json
from vllm.model_executor.models.registry import ModelRegistry, _ModelInfo
walked = {}
for arch in sorted(ModelRegistry.get_supported_archs()):
    try:
        model_cls = ModelRegistry.models[arch].load_model_cls()
        walked[arch] = dataclasses.asdict(_ModelInfo.from_model_cls(model_cls))
    except ImportError as e:
        walked[arch] = {"import_error": f"{type(e).__name__}: {e}"}
print("WALKED " + json.dumps(walked))
"""
MIN_INSPECTED = 250
# Registry flags of classes needing a state cache or media inputs.
NEEDS_MORE_THAN_ATTENTION = (
    "is_attention_free",
    "is_hybrid",
    "has_inner_state",
    "supports_multimodal",
    "supports_transcription",
)
REFUSED = {
    "MambaForCausalLM": "state-space",
    "Mamba2ForCausalLM": "state-space",
    "JambaForCausalLM": "mixes attention with Mamba",
    "PaliGemmaForConditionalGeneration": "image, audio or video inputs",
    "Phi3VForCausalLM": "image, audio or video inputs",
    "Qwen2AudioForConditionalGeneration": "image, audio or video inputs",
    "WhisperForConditionalGeneration": "speech-to-text",
    "DeepseekV4ForCausalLM": "compressed entries of 4 tokens",
}
ALLOWED = (
    "LlamaForCausalLM",
    "MixtralForCausalLM",
    "DeepseekV2ForCausalLM",
    "Gemma2ForCausalLM",
    "BloomForCausalLM",
    "GptOssForCausalLM",  # attention sinks, biased clamped-SwiGLU experts
    "Llama4ForCausalLM",  # Llama 4 text: chunked attention, experts on the input
    "Gemma4ForCausalLM",  # KV sharing, per-layer inputs, heads of 512
    "GPT2ForSequenceClassification",
    "Qwen2ForRewardModel",
    "BertModel",
    "Qwen2_5_VLForConditionalGeneration",  # windowed vision attention
    "Qwen3VLForConditionalGeneration",  # deepstack, interleaved M-RoPE
    "Gemma3ForConditionalGeneration",  # image tokens attend both ways
    "Mistral3ForConditionalGeneration",  # Pixtral tower
    "GraniteMoeHybridForCausalLM",  # Mamba2 layers: a state cache
    "Qwen3NextForCausalLM",  # gated delta-net layers: a state cache
    "Qwen3_5ForCausalLM",  # gated delta-net, gated attention with M-RoPE
    "Qwen3_5MoeForCausalLM",  # and a sigmoid-gated shared expert
    "NemotronHForCausalLM",  # Mamba2, relu2 MLPs, non-gated relu2 experts
    "Llama4ForConditionalGeneration",  # tiled tower, buckets of tiles
    "Qwen3_5ForConditionalGeneration",  # Qwen3-VL's tower, hybrid decoder
    "Qwen3_5MoeForConditionalGeneration",
    "Gemma4ForConditionalGeneration",  # image spans in windowed layers only
    "DeepseekV32ForCausalLM",  # sparse MLA (attention/sparse_mla.py)
)


# The walk imports all of vLLM's model modules in a fresh process (half a
# minute): `make test-fast` leaves its tests out.
WALKS_THE_REGISTRY = pytest.mark.slow


@pytest.fixture(scope="module")
def registry_walk() -> dict[str, dict]:
    result = subprocess.run(
        [sys.executable, "-c", _WALK],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("WALKED ")]
    return json.loads(line.removeprefix("WALKED "))


def _reasons(walked: dict[str, dict]) -> dict[str, str | None]:
    return {
        arch: unsupported_reason(_ModelInfo(**entry))
        for arch, entry in walked.items()
        if "import_error" not in entry
    }


@WALKS_THE_REGISTRY
def test_walk_covers_the_whole_registry(registry_walk):
    assert set(registry_walk) == set(ModelRegistry.get_supported_archs())
    assert len(_reasons(registry_walk)) >= MIN_INSPECTED


@WALKS_THE_REGISTRY
@pytest.mark.parametrize("arch", sorted(REFUSED))
def test_known_unsupported_classes_are_refused_naming_the_piece(registry_walk, arch):
    reason = _reasons(registry_walk)[arch]
    assert reason is not None and reason.startswith(arch)
    assert REFUSED[arch] in reason and ": use " in reason


@WALKS_THE_REGISTRY
@pytest.mark.parametrize("arch", ALLOWED)
def test_classes_the_plugin_runs_are_allowed(registry_walk, arch):
    assert _reasons(registry_walk)[arch] is None


@WALKS_THE_REGISTRY
def test_llava_and_qwen2_vl_import_and_are_the_multimodal_classes_allowed(
    registry_walk,
):
    # torchvision imports beside the CPU torch (patches.allow_torchvision_import).
    assert "import_error" not in registry_walk["LlavaForConditionalGeneration"]
    assert "import_error" not in registry_walk["Qwen2VLForConditionalGeneration"]
    allowed = {
        arch
        for arch, reason in _reasons(registry_walk).items()
        if reason is None and registry_walk[arch]["supports_multimodal"]
    }
    assert allowed == set(FED_MULTIMODAL_ARCHS)


@WALKS_THE_REGISTRY
def test_every_state_cache_multimodal_or_named_class_is_refused(registry_walk):
    counts: collections.Counter[str] = collections.Counter()
    for arch, entry in registry_walk.items():
        if "import_error" in entry:
            counts["not importable here"] += 1
            continue
        reason = unsupported_reason(_ModelInfo(**entry))
        needs_more = any(entry[flag] for flag in NEEDS_MORE_THAN_ATTENTION)
        # By class: vLLM registers aliases of a runnable class (Nemotron-H's
        # NemotronHPuzzleForCausalLM builds NemotronHForCausalLM).
        runnable = FED_MULTIMODAL_ARCHS | RUNNABLE_HYBRID_ARCHS
        needs_more &= entry["architecture"] not in runnable
        needs_more |= arch in MISSING_ARCHS  # refused by name (DeepSeek-V4)
        assert (reason is not None) == needs_more, arch
        counts["refused" if reason else "allowed"] += 1
    assert counts["refused"] >= 60 and counts["allowed"] >= 200


def _engine_config(model: str | Path, **kwargs: Any):
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=str(model), max_model_len=64, **kwargs)
    return args.create_engine_config()


@WALKS_THE_REGISTRY
def test_start_up_step_passes_a_decoder():
    config = _engine_config(model_path("tiny-llama"))  # the whole config hook ran
    refusals.reject_unsupported_model(config)


def test_start_up_refuses_a_multimodal_model_unless_every_limit_is_0(tmp_path):
    """PaliGemma (tiny Gemma 3's checkpoint under its class) with images is
    refused in the platform's config hook; with every modality at 0 it starts
    as a text model."""
    shutil.copytree(model_path("tiny-gemma3"), tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "config.json").read_text())
    config["architectures"] = ["PaliGemmaForConditionalGeneration"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="image, audio or video inputs"):
        _engine_config(tmp_path)
    config = _engine_config(tmp_path, limit_mm_per_prompt={"image": 0})
    refusals.reject_unsupported_model(config)
    assert not config.model_config.supports_multimodal_inputs


def test_start_up_refuses_a_mamba_checkpoint(tmp_path):
    source = Path(model_path("tiny-llama"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, tmp_path / name)
    mamba = {
        "architectures": ["MambaForCausalLM"],
        "model_type": "mamba",
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "vocab_size": 128,
    }
    (tmp_path / "config.json").write_text(json.dumps(mamba))
    with pytest.raises(ValueError, match=r"cannot run this model: Mamba.*state"):
        _engine_config(tmp_path)


@pytest.mark.parametrize(
    ("model", "modality"),
    [
        ("tiny-qwen2-vl", "video"),
        ("tiny-qwen2.5-vl", "video"),
        ("tiny-qwen3-vl", "video"),
        ("tiny-qwen3.5-vl", "video"),
        ("tiny-gemma4-vl", "video"),
        ("tiny-gemma4-vl", "audio"),
    ],
)
def test_image_models_take_images_only(model, modality):
    config = _engine_config(model_path(model))
    mm_config = config.model_config.multimodal_config
    assert mm_config.get_limit_per_prompt(modality) == 0
    assert mm_config.get_limit_per_prompt("image") > 0
    with pytest.raises(ValueError, match=f"{modality} inputs, which the HPU plugin"):
        _engine_config(model_path(model), limit_mm_per_prompt={modality: 1})
