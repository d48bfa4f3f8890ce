"""Start-up settings of a hybrid model (attention plus Mamba2 or linear-attention
layers), applied by the platform's config hook.

The HPU runner keeps one state per running request (mamba cache mode "none":
worker/capabilities/state_cache.py), so prefix caching, which needs states
cached per block ("align"), is switched off where vLLM defaulted it on and
refused where the user asked for it. Features not yet run with state layers are
refused here, before weights load.
"""

from typing import TYPE_CHECKING

from vllm.logger import init_logger

from vllm_hpu import patches
from vllm_hpu.kv_transfer.config import has_kv_connector

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.platforms.interface import Platform

logger = init_logger("vllm.hpu.hybrid_config")


def configure_hybrid(vllm_config: "VllmConfig", platform: "type[Platform]") -> None:
    """Refuse what hybrids cannot use yet; keep one state per request; size
    the attention block to hold a state page now, with vLLM's own alignment
    (``Platform._align_hybrid_block_size``): vLLM runs it again after loading
    the model, with the same result, but the runner is built before that and
    keeps the block size it starts with."""
    model_config = vllm_config.model_config
    if model_config is None or not model_config.is_hybrid:
        return
    _reject_unsupported_features(vllm_config)
    _keep_one_state_per_request(vllm_config)
    from vllm_hpu.attention.backend import HpuAttentionBackend

    platform._align_hybrid_block_size(vllm_config, HpuAttentionBackend)


def _unsupported_features(vllm_config: "VllmConfig") -> dict[str, bool]:
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    parallel = vllm_config.parallel_config
    asked = patches.requested_state_options
    return {
        "speculative decoding (--speculative-config)": (
            vllm_config.speculative_config is not None
        ),
        "KV connectors or KV offloading": has_kv_connector(vllm_config),
        "LoRA adapters (--enable-lora)": vllm_config.lora_config is not None,
        "sleep mode": vllm_config.model_config.enable_sleep_mode,
        "ReplaySSM (--use-replayssm)": vllm_config.cache_config.use_replayssm,
        "the DS conv state layout (VLLM_SSM_CONV_STATE_LAYOUT=DS)": (
            is_conv_state_dim_first()
        ),
        "--disable-hybrid-kv-cache-manager": bool(
            vllm_config.scheduler_config.disable_hybrid_kv_cache_manager
        ),
        "tensor, pipeline or data parallelism": parallel.world_size_across_dp > 1,
        "prefix caching (--enable-prefix-caching)": bool(
            asked.get("enable_prefix_caching")
        ),
        "a Mamba cache mode other than 'none' (--mamba-cache-mode)": (
            asked.get("mamba_cache_mode", "none") != "none"
            or vllm_config.cache_config.mamba_cache_mode == "all"
        ),
        "--mamba-block-size (the state spans the whole sequence)": (
            asked.get("mamba_block_size") is not None
        ),
    }


def _reject_unsupported_features(vllm_config: "VllmConfig") -> None:
    architecture = vllm_config.model_config.architecture
    for feature, asked in _unsupported_features(vllm_config).items():
        if asked:
            raise ValueError(
                f"The HPU plugin does not support {feature} with hybrid models "
                f"({architecture}) yet; start vLLM without it."
            )


def _keep_one_state_per_request(vllm_config: "VllmConfig") -> None:
    """Mamba cache mode "none": one state block per request spanning
    ``max_model_len``, no prefix caching (vLLM's own defaults without it)."""
    cache_config = vllm_config.cache_config
    if cache_config.enable_prefix_caching:
        logger.info(
            "Prefix caching is off for %s: the HPU plugin keeps one state per "
            "request (Mamba cache mode 'none'), none per cached block.",
            vllm_config.model_config.architecture,
        )
        cache_config.enable_prefix_caching = False
    cache_config.mamba_cache_mode = "none"
    cache_config.mamba_block_size = vllm_config.model_config.max_model_len
