"""Which models the HPU plugin cannot run: classes, read from vLLM's model registry,
and features their config switches on.

A refusal names the missing piece and what to use instead, so it can stop start-up
in the caller's process, before the engine process starts.
"""

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PretrainedConfig
    from vllm.config import ModelConfig, VllmConfig
    from vllm.model_executor.models.registry import _ModelInfo

# The hybrids whose state layers (Mamba2, gated delta-net) the plugin runs.
_VALIDATED_HYBRIDS = "Granite-4.0-H, Nemotron-H, Qwen3-Next or Qwen3.5"
# Checked in this order: the first missing piece is the one named.
_MISSING_PIECES = (
    (
        "is_attention_free",
        "is a state-space model (Mamba-style) without attention layers; the HPU "
        "plugin runs state layers only beside attention, in the hybrids it "
        f"validated: use {_VALIDATED_HYBRIDS}, or an attention model",
    ),
    (
        "is_hybrid",
        "mixes attention with Mamba or linear-attention layers the HPU plugin "
        "has not validated (it runs Mamba2 and gated delta-net layers, in the "
        f"hybrids it validated): use {_VALIDATED_HYBRIDS}, or an attention-only "
        "model",
    ),
    (
        "has_inner_state",
        "keeps a recurrent state between steps in layers the HPU plugin has not "
        f"validated: use {_VALIDATED_HYBRIDS}, or an attention model",
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
# Hybrid classes whose state layers (Mamba2, gated delta-net) have HPU versions
# (attention/state_layers.py) and whose generations were validated end to end against
# transformers: the state-cache refusals above do not apply to them.
RUNNABLE_HYBRID_ARCHS = frozenset(
    {
        "GraniteMoeHybridForCausalLM",
        "Qwen3NextForCausalLM",
        "Qwen3_5ForCausalLM",
        "Qwen3_5MoeForCausalLM",
        "NemotronHForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
    }
)
_STATE_FLAGS = ("is_hybrid", "has_inner_state")
# DeepSeek-V4 shares only the lightning indexer's scoring with V3.2's sparse
# MLA (attention/sparse_mla.py); the rest is new to the plugin.
_DEEPSEEK_V4 = (
    "is DeepSeek-V4, whose attention is not V3.2's sparse MLA: one shared key-value "
    "head (not a latent) over a sliding window, compressed entries of 4 tokens "
    "that its indexer picks from, or of 128 tokens, per-head attention sinks, "
    "inverse-rotated outputs and a grouped output projection; hyper-connections "
    "between layers and hash-routed experts. The HPU plugin has none of these: "
    "use DeepSeek-V3.2 (DeepseekV32ForCausalLM) or DeepSeek-V3"
)
MISSING_ARCHS = dict.fromkeys(
    (
        "DeepseekV4ForCausalLM",
        "DeepseekV4ForConditionalGeneration",
        "DeepseekV41ForCausalLM",
    ),
    _DEEPSEEK_V4,
)
# Multimodal classes whose inputs the runner feeds
# (worker/capabilities/multimodal.py): an encoder whose outputs replace
# placeholder tokens, causal attention (or vLLM's mm prefix ranges, where image
# tokens attend both ways: worker/passes/seqs.py ImageSpans), and 1-D positions
# or M-RoPE positions (worker/capabilities/mrope.py). Others may need more
# (audio or video encoders, other M-RoPE variants, PrefixLM variants such as
# PaliGemma's), so each is validated end to end before it is listed here.
FED_MULTIMODAL_ARCHS = frozenset(
    {
        "LlavaForConditionalGeneration",
        "Qwen2VLForConditionalGeneration",
        # Windowed vision attention (the tower reorders its tokens itself).
        "Qwen2_5_VLForConditionalGeneration",
        # Deepstack features: embed_input_ids keeps them for the next forward.
        "Qwen3VLForConditionalGeneration",
        # Bidirectional attention among each image's tokens.
        "Gemma3ForConditionalGeneration",
        # Pixtral tower: images at their own size, row breaks between tokens.
        "Mistral3ForConditionalGeneration",
        # Tiled tower with a 2-D rotary embedding and pixel shuffle: passes
        # bucketed by tiles (bucketing/tile_buckets.py).
        "Llama4ForConditionalGeneration",
        # Qwen3-VL's tower (no deepstack) before a hybrid decoder.
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        # Image tokens both ways in the windowed layers only, within the
        # window (worker/passes/seqs.py image_spans).
        "Gemma4ForConditionalGeneration",
    }
)
# Inputs a fed class takes that have not been validated: none per prompt.
UNVALIDATED_MODALITIES = {
    "Qwen2VLForConditionalGeneration": ("video",),
    "Qwen2_5_VLForConditionalGeneration": ("video",),
    "Qwen3VLForConditionalGeneration": ("video",),
    "Qwen3_5ForConditionalGeneration": ("video",),
    "Qwen3_5MoeForConditionalGeneration": ("video",),
    # Its audio tower (checkpoints with an audio_config) never ran here.
    "Gemma4ForConditionalGeneration": ("video", "audio"),
}


def unsupported_reason(info: "_ModelInfo") -> str | None:
    """Why the plugin cannot run the architecture ``info`` describes, or None.

    ``info`` is vLLM's registry entry (``ModelRegistry.inspect_model_cls``);
    decoders, MoE, MLA and pooling models pass.
    """
    if info.architecture in MISSING_ARCHS:
        return f"{info.architecture} {MISSING_ARCHS[info.architecture]}."
    runnable_hybrid = info.architecture in RUNNABLE_HYBRID_ARCHS
    for flag, missing in _MISSING_PIECES:
        if runnable_hybrid and flag in _STATE_FLAGS:
            continue
        if getattr(info, flag):
            return f"{info.architecture} {missing}."
    if info.supports_multimodal and info.architecture not in FED_MULTIMODAL_ARCHS:
        return (
            f"{info.architecture} takes image, audio or video inputs, which the HPU "
            "plugin feeds only to the image models it validated "
            f"({', '.join(sorted(FED_MULTIMODAL_ARCHS))}): use one of those, a "
            "text-only model, or this one as text only (every modality of "
            "--limit-mm-per-prompt at 0)."
        )
    if info.attn_type == "encoder_decoder":
        return (
            f"{info.architecture} is an encoder-decoder model; the HPU plugin has "
            "no cross-attention cache: use a decoder-only model."
        )
    return None


def model_config_reason(model_config: "ModelConfig") -> str | None:
    """:func:`unsupported_reason` for the configured model, with the flags that
    ``ModelConfig`` refines from the checkpoint's own config, then
    :func:`config_feature_reason`."""
    return _model_class_reason(model_config) or config_feature_reason(
        model_config.architecture, model_config.hf_text_config
    )


def _model_class_reason(model_config: "ModelConfig") -> str | None:
    info = dataclasses.replace(
        model_config._model_info,
        # A hybrid class whose checkpoint holds attention layers only runs as
        # a plain decoder (vLLM's own rule, ModelConfig.is_hybrid).
        is_hybrid=model_config.is_hybrid,
        # Every modality limited to 0 (or --language-model-only): vLLM builds
        # no encoder and the runner feeds token ids, as to a text model.
        supports_multimodal=model_config.supports_multimodal_inputs,
        attn_type=(
            "encoder_decoder"
            if model_config.is_encoder_decoder
            else model_config._model_info.attn_type
        ),
    )
    return unsupported_reason(info)


# gpt-oss's sinks run (validated end to end); other families switch sinks on with
# a key of their config (Granite, MiMo-V2, Laguna, as vLLM's models read them),
# which no test has run.
_SINK_KEYS = (
    "attention_sinks",
    "add_swa_attention_sink_bias",
    "swa_attention_sink_enabled",
)


def _has_unvalidated_sinks(text_config: "PretrainedConfig") -> bool:
    return text_config.model_type != "gpt_oss" and any(
        getattr(text_config, key, False) is True for key in _SINK_KEYS
    )


# vLLM's gpt-oss runs its experts' clamped SwiGLU with these constants whatever
# the checkpoint's config says (ops/activations.py SWIGLUOAI_ALPHA, _LIMIT).
_GPT_OSS_SWIGLU = {"swiglu_alpha": 1.702, "swiglu_limit": 7.0}


def _gpt_oss_swiglu_differs(text_config: "PretrainedConfig") -> bool:
    return text_config.model_type == "gpt_oss" and any(
        getattr(text_config, key, value) != value
        for key, value in _GPT_OSS_SWIGLU.items()
    )


def _weights_inputs_of_several_experts(text_config: "PretrainedConfig") -> bool:
    """Llama 4's MoE layers (every interleave_moe_layer_step-th) scale each
    expert's input by its routing weight, which ops/moe.py does for one expert
    per token (Scout, Maverick)."""
    return (
        text_config.model_type == "llama4_text"
        and getattr(text_config, "num_local_experts", 0) > 0
        and getattr(text_config, "interleave_moe_layer_step", 0) > 0
        and getattr(text_config, "num_experts_per_tok", 1) > 1
    )


def _has_zero_experts(text_config: "PretrainedConfig") -> bool:
    return getattr(text_config, "zero_expert_num", 0) > 0


def _has_unvalidated_sparse_attention(text_config: "PretrainedConfig") -> bool:
    """A lightning indexer (``index_topk``) outside DeepSeek-V3.2 (GLM-5's
    DSA and kin), or layers that reuse another layer's top-k (IndexCache:
    ``index_topk_freq``, ``index_topk_pattern``)."""
    if getattr(text_config, "index_topk", None) is None:
        return False
    skips = getattr(text_config, "index_topk_freq", 1) != 1 or bool(
        getattr(text_config, "index_topk_pattern", None)
    )
    return skips or text_config.model_type != "deepseek_v32"


# Features a model's config switches on that the HPU ops lack: (what, whether the
# text config asks for it, what to do). Checked in order, the first named. What
# only the built model shows is refused while it is built (attention/backend.py,
# ops/fused_moe.py), in the engine process.
_CONFIG_FEATURES: tuple[tuple[str, Callable[["PretrainedConfig"], bool], str], ...] = (
    (
        "attention sinks outside gpt-oss (the family validated with them)",
        _has_unvalidated_sinks,
        "use a model without attention sinks (or gpt-oss)",
    ),
    (
        "an expert SwiGLU other than vLLM's gpt-oss runs (swiglu_alpha 1.702, "
        "swiglu_limit 7.0: vLLM ignores these keys)",
        _gpt_oss_swiglu_differs,
        "use a checkpoint with those values",
    ),
    (
        "MoE routing weights applied to the input of several experts per token",
        _weights_inputs_of_several_experts,
        "use a Llama 4 with one expert per token (num_experts_per_tok 1)",
    ),
    (
        "zero experts (tokens routed to an identity expert)",
        _has_zero_experts,
        "use an MoE model without them",
    ),
    (
        "sparse attention other than DeepSeek-V3.2's, where every layer's "
        "indexer picks its queries' keys (the one validated on the HPU plugin)",
        _has_unvalidated_sparse_attention,
        "use a DeepSeek-V3.2 checkpoint (DeepseekV32ForCausalLM) with an indexer "
        "in every layer",
    ),
)


def config_feature_reason(
    architecture: str, text_config: "PretrainedConfig"
) -> str | None:
    """Why the HPU plugin cannot run what a model's (text) config asks for, or
    None; read from the config alone, before the engine starts."""
    for what, asked, fix in _CONFIG_FEATURES:
        if asked(text_config):
            return (
                f"{architecture} uses {what}, which the HPU plugin does not "
                f"support: {fix}."
            )
    return None


def limit_unvalidated_modalities(model_config: "ModelConfig") -> None:
    """Allow no item per prompt of a modality :data:`UNVALIDATED_MODALITIES`
    names (vLLM then rejects such a prompt, naming the limit); a limit the user
    set above zero stops start-up."""
    from vllm.config.multimodal import AudioDummyOptions, VideoDummyOptions

    none_of = {
        "video": VideoDummyOptions(count=0, num_frames=None, width=None, height=None),
        "audio": AudioDummyOptions(count=0, length=None),
    }
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
        mm_config.limit_per_prompt[modality] = none_of[modality]


def keep_bidirectional_items_whole(vllm_config: "VllmConfig") -> None:
    """Schedule each image of a model whose image tokens attend both ways
    (Gemma 3) within one step, as vLLM does on ROCm: an image cut between two
    prompt chunks would have its first part attend to the first part only, and
    differ from the model's own (transformers') attention."""
    from vllm.logger import init_logger

    model_config = vllm_config.model_config
    scheduler_config = vllm_config.scheduler_config
    if model_config.is_mm_prefix_lm and not scheduler_config.disable_chunked_mm_input:
        init_logger("vllm.hpu.model_support").info(
            "Scheduling each image of %s in one step (--disable-chunked-mm-input): "
            "its image tokens attend to each other both ways.",
            model_config.architecture,
        )
        scheduler_config.disable_chunked_mm_input = True
