"""What start-up refuses, in the caller's process and before weights load: a
feature, option or model the HPU plugin cannot run, each error naming the fix."""

import importlib.util
from typing import TYPE_CHECKING

from vllm_hpu import compat, envs
from vllm_hpu.config import model_support
from vllm_hpu.kv_transfer.connectors import has_kv_connector

if TYPE_CHECKING:
    from vllm.config import VllmConfig


def reject_unsupported_features(vllm_config: "VllmConfig") -> None:
    """Fail at start-up, naming the option to drop, rather than mid-generation."""
    version = compat.unsupported_vllm_version()
    if version:
        raise ValueError(version)
    model_config = vllm_config.model_config
    runner_type = model_config.runner_type if model_config is not None else "generate"
    unsupported = {
        # "draft": a speculative draft model's config
        # (worker/spec_decode/draft_model.py).
        f"the '{runner_type}' runner (--runner)": runner_type
        not in ("generate", "pooling", "draft"),
        # vLLM 0.32's older Ray executor; 0.33 has only the V2 one, which the
        # plugin runs (distributed/ray_cluster.py).
        "VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0 (vLLM 0.32's older Ray executor, "
        "gone in 0.33; unset it to run Ray on the V2 executor)": (
            vllm_config.parallel_config.distributed_executor_backend == "ray"
            and compat.legacy_ray_executor_requested()
        ),
    }
    unsupported |= _sleep_limits(vllm_config)
    # Gemma 4 then skips its KV-sharing layers' queries of prompt tokens that
    # sample nothing: logits indices the runner does not pass.
    unsupported["--kv-sharing-fast-prefill"] = bool(
        vllm_config.cache_config.kv_sharing_fast_prefill
    )
    # Drafts' rows would need the verification's acceptance counts.
    unsupported[
        "routed experts returned (enable_return_routed_experts) with speculative "
        "decoding"
    ] = bool(
        vllm_config.aux_output_config.enable_return_routed_experts
        and vllm_config.speculative_config is not None
    )
    unsupported |= _sparse_attention_limits(vllm_config)
    from vllm_hpu.worker.capabilities.data_parallel import unsupported_layouts

    unsupported |= unsupported_layouts(vllm_config)
    for feature, setting in unsupported.items():
        if setting:
            raise ValueError(
                f"The HPU plugin does not support {feature} yet; start vLLM without it."
            )
    from vllm_hpu.worker.spec_decode.methods import check_speculative_config

    check_speculative_config(vllm_config)
    _require_optional_packages(vllm_config)


def _sleep_limits(vllm_config: "VllmConfig") -> dict[str, bool]:
    """What sleep mode and weight updates do not run with."""
    model_config = vllm_config.model_config
    sleep_backend = model_config.sleep_mode_backend if model_config else "cumem"
    sleeps = model_config is not None and model_config.enable_sleep_mode
    weights_change = sleeps or bool(vllm_config.weight_transfer_config)
    return {
        # The worker's own sleep mode (capabilities/sleep.py) answers vLLM's
        # sleep RPCs; vLLM's backends (cumem, xpumem, plugins') are never called.
        f"the '{sleep_backend}' sleep mode backend (--sleep-mode-backend)": (
            sleep_backend != "cumem"
        ),
        "sleep mode or weight transfer with a draft model": (
            weights_change and vllm_config.speculative_config is not None
        ),
        # A connector registered the caches that sleep would free and reallocate.
        "sleep mode with a KV connector": sleeps and has_kv_connector(vllm_config),
    }


def _sparse_attention_limits(vllm_config: "VllmConfig") -> dict[str, bool]:
    """What DeepSeek-V3.2's sparse attention has not been run with here."""
    model_config = vllm_config.model_config
    text_config = model_config.hf_text_config if model_config is not None else None
    if getattr(text_config, "index_topk", None) is None:
        return {}
    parallel = vllm_config.parallel_config
    sizes = (
        parallel.tensor_parallel_size,
        parallel.pipeline_parallel_size,
        parallel.data_parallel_size,
    )
    return {
        "DeepSeek-V3.2's sparse attention with tensor, pipeline or data "
        "parallelism": max(sizes) > 1,
        "DeepSeek-V3.2's sparse attention with a KV connector": has_kv_connector(
            vllm_config
        ),
        # A verification pass holds several queries per row; MTP layers have
        # indexers of their own.
        "DeepSeek-V3.2's sparse attention with speculative decoding": (
            vllm_config.speculative_config is not None
        ),
    }


def _asks_ngram(vllm_config: "VllmConfig") -> bool:
    speculative = vllm_config.speculative_config
    return speculative is not None and speculative.method == "ngram"


def _asks_inc(vllm_config: "VllmConfig") -> bool:
    model_config = vllm_config.model_config
    quantization = model_config.quantization if model_config is not None else None
    return quantization == "inc" or bool(envs.get_envs().quant_config)


# Optional features whose package the main set-up does not install
# (requirements-test.txt pins the tested versions): (feature, asked, module, pin).
# (Ray's absence vLLM names itself, in the caller's process.)
_OPTIONAL_PACKAGES = (
    ("n-gram speculative decoding", _asks_ngram, "numba", "numba==0.65.0"),
    (
        "Intel Neural Compressor's FP8 (--quantization inc, QUANT_CONFIG)",
        _asks_inc,
        "neural_compressor",
        "neural-compressor-pt==3.10",
    ),
)


def _require_optional_packages(vllm_config: "VllmConfig") -> None:
    """Name the package an asked-for feature lacks, rather than let the engine
    process fail on its import."""
    for feature, asked, module, pin in _OPTIONAL_PACKAGES:
        if asked(vllm_config) and importlib.util.find_spec(module) is None:
            raise ValueError(
                f"{feature} needs the package {pin.split('==')[0]}, which is not "
                f"installed: pip install {pin} (or run make test-setup)."
            )


def reject_unsupported_model(vllm_config: "VllmConfig") -> None:
    """Refuse a model class we cannot run (state-space, hybrid, multimodal,
    speech, encoder-decoder), or a feature its config asks for (attention sinks,
    chunked attention, MoE routing variants), here in the caller's process: its
    exception names the reason, as the engine process's could not."""
    model_config = vllm_config.model_config
    reason = model_config and model_support.model_config_reason(model_config)
    if reason:
        raise ValueError(f"The HPU plugin cannot run this model: {reason}")
    if model_config is not None:
        model_support.limit_unvalidated_modalities(model_config)
        model_support.keep_bidirectional_items_whole(vllm_config)


def reject_split_pooled_prompts(vllm_config: "VllmConfig") -> None:
    """MEAN and CLS pooling need a whole prompt in one step (vLLM's own rule,
    ModelConfig.is_chunked_prefill_supported): it turns chunked prefill and
    prefix caching off for them by default, but does not stop a user forcing
    them on, which would fail in the pooler on the first long prompt."""
    model_config = vllm_config.model_config
    if model_config is None or model_config.runner_type != "pooling":
        return
    if model_config.is_chunked_prefill_supported:
        return
    forced = {
        "chunked prefill (--enable-chunked-prefill)": (
            vllm_config.scheduler_config.enable_chunked_prefill
        ),
        "prefix caching (--enable-prefix-caching)": (
            vllm_config.cache_config.enable_prefix_caching
        ),
    }
    pooler = model_config.pooler_config
    pooling_type = pooler and (pooler.seq_pooling_type or pooler.tok_pooling_type)
    for feature, enabled in forced.items():
        if enabled:
            raise ValueError(
                f"{feature} splits prompts, which {pooling_type} pooling cannot "
                "pool on the HPU plugin; start vLLM without it."
            )
