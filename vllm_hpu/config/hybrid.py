"""Start-up settings of a hybrid model (attention plus Mamba2 or linear-attention
layers), applied by the platform's config hook.

The HPU runner keeps one state per running request (worker/capabilities/
state_cache.py) and, with prefix caching (vLLM's Mamba cache mode "align", which
vLLM turns on with it), the states at block boundaries too
(state_checkpoints.py): hits land on whole blocks only. Without prefix caching
the mode is "none", as with speculative decoding (n-gram drafts: a verified
row's states are kept per draft, and prefix caching is turned off). Features
not yet run with state layers are refused here, before weights load.
"""

from typing import TYPE_CHECKING

from vllm_hpu.kv_transfer.connectors import has_kv_connector
from vllm_hpu.patches import engine_args

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.platforms.interface import Platform


def configure_hybrid(vllm_config: "VllmConfig", platform: "type[Platform]") -> None:
    """Refuse what hybrids cannot use yet; without prefix caching keep one
    state per request (with it vLLM chose mode "align" already); size
    the attention block to hold a state page now, with vLLM's own alignment
    (``Platform._align_hybrid_block_size``): vLLM runs it again after loading
    the model, with the same result, but the runner is built before that and
    keeps the block size it starts with."""
    model_config = vllm_config.model_config
    if model_config is None or not model_config.is_hybrid:
        return
    _reject_unsupported_features(vllm_config)
    if vllm_config.speculative_config is not None:
        _no_prefix_caching_with_drafts(vllm_config)
    if not vllm_config.cache_config.enable_prefix_caching:
        _keep_one_state_per_request(vllm_config)
    from vllm_hpu.attention.backend import HpuAttentionBackend

    platform._align_hybrid_block_size(vllm_config, HpuAttentionBackend)


def _unsupported_features(vllm_config: "VllmConfig") -> dict[str, bool]:
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    from vllm_hpu.attention.windows import HYBRID_DRAFTS

    parallel = vllm_config.parallel_config
    cache_config = vllm_config.cache_config
    asked = engine_args.requested_options(vllm_config)
    speculative = vllm_config.speculative_config
    return {
        "speculative decoding other than n-gram and MTP drafts": (
            speculative is not None and speculative.method not in HYBRID_DRAFTS
        ),
        "KV connectors or KV offloading": has_kv_connector(vllm_config),
        "ReplaySSM (--use-replayssm)": cache_config.use_replayssm,
        "the DS conv state layout (VLLM_SSM_CONV_STATE_LAYOUT=DS)": (
            is_conv_state_dim_first()
        ),
        # Before the hybrid KV cache manager: the platform turns it off for
        # pipeline parallelism.
        "pipeline or data parallelism": (
            parallel.pipeline_parallel_size > 1 or parallel.data_parallel_size > 1
        ),
        "--disable-hybrid-kv-cache-manager": bool(
            asked.disable_hybrid_kv_cache_manager
        ),
        "--mamba-block-size (states are kept per KV cache block)": (
            asked.mamba_block_size is not None
        ),
        "--prefix-match-unit (prefix hits land on whole state blocks)": (
            cache_config.prefix_match_unit is not None
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


def _no_prefix_caching_with_drafts(vllm_config: "VllmConfig") -> None:
    """A verified row's state is kept per draft, not at block boundaries:
    prefix caching (on by vLLM's default) is turned off, and refused when
    asked for."""
    cache_config = vllm_config.cache_config
    if not cache_config.enable_prefix_caching:
        return
    if engine_args.requested_options(vllm_config).enable_prefix_caching:
        raise ValueError(
            "The HPU plugin does not support prefix caching with speculative "
            f"decoding on hybrid models ({vllm_config.model_config.architecture}) "
            "yet; drop --enable-prefix-caching."
        )
    from vllm.logger import init_logger

    init_logger("vllm.hpu.hybrid").info(
        "Prefix caching off: %s keeps its states per draft with speculative "
        "decoding, not at block boundaries.",
        vllm_config.model_config.architecture,
    )
    cache_config.enable_prefix_caching = False


def _keep_one_state_per_request(vllm_config: "VllmConfig") -> None:
    """Mamba cache mode "none": one state block per request spanning
    ``max_model_len`` (vLLM's own defaults without prefix caching)."""
    cache_config = vllm_config.cache_config
    cache_config.mamba_cache_mode = "none"
    cache_config.mamba_block_size = vllm_config.model_config.max_model_len
