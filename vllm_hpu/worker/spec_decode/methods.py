"""What the HPU runner can speculate with, refused at start-up otherwise
(called by the platform's config check, before any weights load)."""

from typing import Any

from vllm.config import VllmConfig

from vllm_hpu import compat

# Proposers the HPU runner drafts with; the others are refused at start-up.
SUPPORTED_METHODS = ("ngram", "draft_model", "eagle", "eagle3", "mtp")
# The methods whose draft reads the target's hidden states (eagle.py).
HIDDEN_STATE_METHODS = ("eagle", "eagle3", "mtp")
# The MTP layers validated against transformers' (tests/e2e/test_eagle.py).
VALIDATED_MTP_ARCHS = ("DeepSeekMTPModel", "Qwen3_5MTP", "Qwen3_5MoeMTP")
# What a refused method needs on the HPU runner, where it is known.
MISSING = {
    "dflash": (
        " (DFlash's parallel drafts in one non-causal pass, and vLLM 0.33's "
        "XPress drafting, which refines them, need a proposer of their own)"
    ),
}


def check_speculative_config(vllm_config: VllmConfig) -> None:
    """Refuse at start-up what the HPU runner cannot speculate with."""
    spec = vllm_config.speculative_config
    if spec is None:
        return
    if spec.method not in SUPPORTED_METHODS:
        raise ValueError(
            f"The HPU plugin does not support the '{spec.method}' speculative "
            f"decoding method yet{MISSING.get(str(spec.method), '')}; use one of "
            f"{list(SUPPORTED_METHODS)} in --speculative-config, or start vLLM "
            "without it."
        )
    if spec.rejection_sample_method != "standard":
        # HpuRejectionSampler verifies each draft token against the target
        # (Leviathan et al.); synthetic, block and FLy (vLLM 0.33) verification
        # are other algorithms.
        raise ValueError(
            "The HPU plugin verifies drafts with the standard rejection sampler "
            f"only, not rejection_sample_method '{spec.rejection_sample_method}'; "
            "drop it from --speculative-config."
        )
    if spec.method in ("draft_model", *HIDDEN_STATE_METHODS):
        _check_draft_options(spec)
        _check_draft_target(vllm_config)
    if spec.method == "mtp":
        _check_mtp(spec)
    if spec.method == "draft_model":
        _check_draft_kv_shape(vllm_config)
    if vllm_config.parallel_config.pipeline_parallel_size > 1:
        raise ValueError(
            "The HPU plugin does not support speculative decoding with pipeline "
            "parallelism; drop --speculative-config or --pipeline-parallel-size."
        )


def _check_draft_options(spec: Any) -> None:
    """Draft-model and EAGLE options the HPU proposers do not implement."""
    unsupported = {
        "draft_sample_method 'probabilistic' (drafts are greedy here)": (
            spec.draft_sample_method != "greedy"
        ),
        "use_heterogeneous_vocab (the draft must share the target's vocabulary)": (
            spec.use_heterogeneous_vocab
        ),
        "parallel_drafting": spec.parallel_drafting,
        **compat.unrun_speculative_options(spec),
    }
    for option, setting in unsupported.items():
        if setting:
            raise ValueError(
                f"The HPU plugin's {spec.method} proposer does not support {option}; "
                "drop it from --speculative-config."
            )


def _check_mtp(spec: Any) -> None:
    """One MTP layer of a validated family drafts here."""
    architectures = spec.draft_model_config.architectures or ["?"]
    if architectures[0] not in VALIDATED_MTP_ARCHS:
        raise ValueError(
            f"The HPU plugin's mtp proposer runs the MTP layers of "
            f"{list(VALIDATED_MTP_ARCHS)}, not yet this model's "
            f"({architectures[0]}); use ngram or draft_model drafts, or start "
            "vLLM without --speculative-config."
        )
    if spec.use_multi_module_mtp():
        raise ValueError(
            "The HPU plugin's mtp proposer drafts with one MTP layer (vLLM "
            "chains several only in its GPU runner); set num_speculative_tokens "
            "to 1 for a checkpoint with several MTP layers."
        )


def _check_draft_target(vllm_config: VllmConfig) -> None:
    """Targets the draft-model and EAGLE proposers do not run beside yet."""
    spec = vllm_config.speculative_config
    assert spec is not None
    model_config = vllm_config.model_config
    draft_tp = getattr(spec.draft_parallel_config, "tensor_parallel_size", 1)
    unsupported = {
        # The draft would read the target's LoRA logits state.
        "LoRA adapters (--enable-lora)": vllm_config.lora_config is not None,
        # The draft would read image placeholders without their embeddings.
        "a multimodal target": model_config is not None
        and model_config.is_multimodal_model,
        # Each rank would hold a whole draft beside its shard (vLLM's rule).
        "a draft_tensor_parallel_size other than --tensor-parallel-size": (
            draft_tp != vllm_config.parallel_config.tensor_parallel_size
        ),
    }
    for feature, setting in unsupported.items():
        if setting:
            raise ValueError(
                f"The HPU plugin's {spec.method} proposer does not run with "
                f"{feature} yet; drop one of them."
            )


def _check_draft_kv_shape(vllm_config: VllmConfig) -> None:
    """A draft model's layers take caches shaped as the target's: vLLM would group
    other KV shapes into a mixed-spec group the HPU caches do not allocate."""
    spec = vllm_config.speculative_config
    assert spec is not None
    parallel = vllm_config.parallel_config
    target, draft = (
        (config.get_num_kv_heads(parallel), config.get_head_size())
        for config in (vllm_config.model_config, spec.draft_model_config)
    )
    if draft != target:
        raise ValueError(
            "The HPU plugin's draft_model proposer needs a draft with the "
            "target's KV heads and head size; the draft has (KV heads, head "
            f"size) {draft}, the target {target}. Build the draft with the "
            "target's num_key_value_heads and head_dim."
        )
