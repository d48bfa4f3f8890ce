"""Which model classes the HPU plugin cannot run, read from vLLM's model registry.

A refusal names the missing piece and what to use instead, so it can stop start-up.
"""

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.config import ModelConfig
    from vllm.model_executor.models.registry import _ModelInfo

# Checked in this order: the first missing piece is the one named.
_MISSING_PIECES = (
    (
        "is_attention_free",
        "is a state-space model (Mamba-style); it needs a Mamba state cache, "
        "which the HPU plugin lacks: use an attention model",
    ),
    (
        "is_hybrid",
        "mixes attention with Mamba or linear-attention layers; those need a "
        "state cache, which the HPU plugin lacks: use an attention-only model",
    ),
    (
        "has_inner_state",
        "keeps a recurrent state between steps, which the HPU plugin has no "
        "cache for: use an attention model",
    ),
    (
        "supports_transcription",
        "is a speech-to-text model; the HPU plugin takes no audio inputs (nor "
        "Whisper's encoder-decoder cache): use a text-only decoder model",
    ),
    (
        "supports_multimodal_raw_input_only",
        "takes raw image, audio or video inputs instead of encoder embeddings, "
        "which the HPU plugin does not feed: use a text-only model",
    ),
)
# Multimodal classes whose inputs the runner feeds
# (worker/capabilities/multimodal.py): an encoder whose outputs replace
# placeholder tokens, with plain causal attention, and 1-D positions or M-RoPE
# positions (worker/capabilities/mrope.py). Others may need more
# (bidirectional attention over image tokens, audio or video encoders, other
# M-RoPE variants), so each is validated end to end before it is listed here.
FED_MULTIMODAL_ARCHS = frozenset(
    {"LlavaForConditionalGeneration", "Qwen2VLForConditionalGeneration"}
)
# Inputs a fed class takes that have not been validated: none per prompt.
UNVALIDATED_MODALITIES = {"Qwen2VLForConditionalGeneration": ("video",)}


def unsupported_reason(info: "_ModelInfo") -> str | None:
    """Why the plugin cannot run the architecture ``info`` describes, or None.

    ``info`` is vLLM's registry entry (``ModelRegistry.inspect_model_cls``);
    decoders, MoE, MLA and pooling models pass.
    """
    for flag, missing in _MISSING_PIECES:
        if getattr(info, flag):
            return f"{info.architecture} {missing}."
    if info.supports_multimodal and info.architecture not in FED_MULTIMODAL_ARCHS:
        return (
            f"{info.architecture} takes image, audio or video inputs, which the HPU "
            "plugin feeds only to the image models it validated "
            f"({', '.join(sorted(FED_MULTIMODAL_ARCHS))}): use one of those or a "
            "text-only model."
        )
    if info.attn_type == "encoder_decoder":
        return (
            f"{info.architecture} is an encoder-decoder model; the HPU plugin has "
            "no cross-attention cache: use a decoder-only model."
        )
    return None


def model_config_reason(model_config: "ModelConfig") -> str | None:
    """:func:`unsupported_reason` for the configured model, with the flags that
    ``ModelConfig`` refines from the checkpoint's own config."""
    info = dataclasses.replace(
        model_config._model_info,
        # A hybrid class whose checkpoint holds attention layers only runs as
        # a plain decoder (vLLM's own rule, ModelConfig.is_hybrid).
        is_hybrid=model_config.is_hybrid,
        attn_type=(
            "encoder_decoder"
            if model_config.is_encoder_decoder
            else model_config._model_info.attn_type
        ),
    )
    return unsupported_reason(info)


def limit_unvalidated_modalities(model_config: "ModelConfig") -> None:
    """Allow no item per prompt of a modality :data:`UNVALIDATED_MODALITIES`
    names (vLLM then rejects such a prompt, naming the limit); a limit the user
    set above zero stops start-up."""
    from vllm.config.multimodal import VideoDummyOptions

    mm_config = model_config.multimodal_config
    if mm_config is None:
        return
    for modality in UNVALIDATED_MODALITIES.get(model_config.architecture, ()):
        asked = mm_config.limit_per_prompt.get(modality)
        if asked is not None and asked.count > 0:
            raise ValueError(
                f"{model_config.architecture} takes {modality} inputs, which the "
                "HPU plugin has not validated (only images): leave "
                f"--limit-mm-per-prompt's {modality!r} out or at 0."
            )
        assert modality == "video", "only video options are built here"
        mm_config.limit_per_prompt[modality] = VideoDummyOptions(
            count=0, num_frames=None, width=None, height=None
        )
