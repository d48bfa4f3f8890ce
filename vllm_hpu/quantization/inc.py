"""Start-up checks of the FP8 options Gaudi users pass (``--kv-cache-dtype``,
``--quantization inc``, ``QUANT_CONFIG``): what runs is set, the rest refused."""

from typing import TYPE_CHECKING

from vllm.logger import init_logger

from vllm_hpu import envs

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger("vllm.hpu.quantization")

# vLLM's names of an e4m3 cache; on Gaudi they all mean INC's fp8_inc cache.
FP8_INC_ALIASES = ("fp8", "fp8_e4m3")


def apply_fp8_options(vllm_config: "VllmConfig") -> None:
    """Map fp8 / fp8_e4m3 to fp8_inc; refuse the INC weight flow, not built yet.
    Other cache dtypes are refused by the attention backends, naming the ones
    they take."""
    cache_config = vllm_config.cache_config
    if cache_config.cache_dtype in FP8_INC_ALIASES:
        logger.info(
            "--kv-cache-dtype %s runs as fp8_inc (e4m3) on HPU.",
            cache_config.cache_dtype,
        )
        cache_config.cache_dtype = "fp8_inc"
    _reject_inc_weights(vllm_config)


def _reject_inc_weights(vllm_config: "VllmConfig") -> None:
    """INC's MEASURE/QUANTIZE flow is not built on this plugin yet: refuse it
    before weights load (vLLM's own ``inc`` is the unrelated auto-round format)."""
    model_config = vllm_config.model_config
    quantization = model_config.quantization if model_config is not None else None
    quant_config = envs.get_envs().quant_config
    if quantization == "inc" or quant_config:
        asked = "--quantization inc" if quantization == "inc" else "QUANT_CONFIG"
        raise ValueError(
            f"{asked}: Intel Neural Compressor FP8 calibration and quantized "
            "weights are not supported by the HPU plugin yet; unset QUANT_CONFIG "
            "and drop --quantization inc (an fp8 KV cache alone runs with "
            "--kv-cache-dtype fp8_inc)."
        )
