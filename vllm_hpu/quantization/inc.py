"""Start-up checks of Gaudi's FP8 options (``--kv-cache-dtype``, ``--quantization
inc``, ``QUANT_CONFIG``): set what runs, refuse the rest naming the file or
option. INC's flow itself is in ``quantization/inc_flow.py``."""

import glob
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from vllm.logger import init_logger

from vllm_hpu import device, envs

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger("vllm.hpu.quantization")

# vLLM's names of an e4m3 cache; on Gaudi they all mean INC's fp8_inc cache.
FP8_INC_ALIASES = ("fp8", "fp8_e4m3")
INC_MODES = ("MEASURE", "QUANTIZE")
# The one scale method that needs no measurement files (INC's own exception).
UNMEASURED_SCALE_METHOD = "unit_scale"
KV_CACHE_MODULE = "VLLMKVCache"


@dataclass(frozen=True)
class IncSettings:
    """What the plugin reads of a QUANT_CONFIG file; INC reads the rest."""

    path: str
    mode: str
    dump_stats_path: str
    scale_method: str
    blocklisted_types: tuple[str, ...]
    dynamic: bool

    @property
    def measures(self) -> bool:
        return self.mode == "MEASURE"

    def measurement_files(self) -> list[str]:
        """The MEASURE pass's files (``<dump_stats_path>_hooks_maxabs*``)."""
        return sorted(glob.glob(f"{self.dump_stats_path}_hooks_maxabs*"))

    def needs_measurements(self) -> bool:
        return not self.measures and self.scale_method != UNMEASURED_SCALE_METHOD

    def quantizes_kv_cache(self) -> bool:
        return not self.measures and KV_CACHE_MODULE not in self.blocklisted_types


def read_inc_settings(path: str) -> IncSettings:
    """Parse QUANT_CONFIG's JSON, naming the file in every error."""
    try:
        with open(path, encoding="utf-8") as file:
            raw = json.load(file)
    except OSError as error:
        raise ValueError(f"QUANT_CONFIG={path}: cannot read it ({error}).") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"QUANT_CONFIG={path}: not valid JSON ({error}).") from None
    if not isinstance(raw, dict):
        raise ValueError(f"QUANT_CONFIG={path}: expected a JSON object.")
    mode = str(raw.get("mode", "QUANTIZE")).upper()
    if mode not in INC_MODES:
        raise ValueError(
            f"QUANT_CONFIG={path}: mode {raw.get('mode')!r} is not supported; "
            f"use one of {list(INC_MODES)}."
        )
    blocklist = raw.get("blocklist") or raw.get("blacklist") or {}
    scale_method = raw.get("scale_method", "maxabs_hw")
    return IncSettings(
        path=path,
        mode=mode,
        dump_stats_path=str(raw.get("dump_stats_path", "stats")),
        scale_method=str(scale_method).lower(),
        blocklisted_types=tuple(blocklist.get("types", ())),
        dynamic=bool(raw.get("dynamic_quantization", False)),
    )


def apply_fp8_options(vllm_config: "VllmConfig") -> None:
    """Map fp8 / fp8_e4m3 to fp8_inc, then check the INC flow if asked for."""
    cache_config = vllm_config.cache_config
    if cache_config.cache_dtype in FP8_INC_ALIASES:
        logger.info(
            "--kv-cache-dtype %s runs as fp8_inc (e4m3) on HPU.",
            cache_config.cache_dtype,
        )
        cache_config.cache_dtype = "fp8_inc"
    settings = inc_settings(vllm_config)
    if settings is not None:
        _check_inc_flow(vllm_config, settings)
        _name_inc(vllm_config)


def _name_inc(vllm_config: "VllmConfig") -> None:
    """QUANT_CONFIG alone runs ``--quantization inc``, its config made as vLLM makes
    it (vLLM made the config before this hook; the core's pass would not)."""
    from vllm_hpu.quantization.inc_config import HpuIncConfig

    vllm_config.model_config.quantization = "inc"
    if vllm_config.quant_config is None:
        vllm_config.quant_config = HpuIncConfig()


def inc_settings(vllm_config: "VllmConfig") -> IncSettings | None:
    """QUANT_CONFIG's settings when the INC flow is asked for, else None."""
    model_config = vllm_config.model_config
    quantization = model_config.quantization if model_config is not None else None
    path = envs.get_envs().quant_config
    if quantization != "inc" and not path:
        return None
    if not path:
        raise ValueError(
            "--quantization inc needs QUANT_CONFIG=<INC json> (a MEASURE config "
            "to calibrate, a QUANTIZE one to serve); see README_GAUDI.md."
        )
    if quantization not in (None, "inc"):
        raise ValueError(
            f"QUANT_CONFIG={path} runs Intel Neural Compressor on unquantized "
            f"weights; it cannot take a {quantization} model: unset QUANT_CONFIG."
        )
    return read_inc_settings(path)


def _check_inc_flow(vllm_config: "VllmConfig", settings: IncSettings) -> None:
    """One error at start-up for what the INC flow cannot take."""
    path, cache_dtype = settings.path, vllm_config.cache_config.cache_dtype
    if vllm_config.model_config.dtype != torch.bfloat16:
        raise ValueError(
            f"QUANT_CONFIG={path}: Intel Neural Compressor's FP8 flow runs bf16 "
            "models; pass --dtype bfloat16."
        )
    if settings.measures and cache_dtype == "fp8_inc":
        raise ValueError(
            f"QUANT_CONFIG={path} is a MEASURE config: calibration runs with a "
            "bf16 KV cache; drop --kv-cache-dtype fp8_inc."
        )
    if settings.quantizes_kv_cache() and cache_dtype != "fp8_inc":
        raise ValueError(
            f"QUANT_CONFIG={path} quantizes the KV cache: pass --kv-cache-dtype "
            f"fp8_inc (or blocklist the {KV_CACHE_MODULE} type)."
        )
    if settings.needs_measurements() and not settings.measurement_files():
        raise ValueError(
            f"QUANT_CONFIG={path}: no measurement files "
            f"{settings.dump_stats_path}_hooks_maxabs*.npz; run the MEASURE "
            "pass first (python -m vllm_hpu.calibrate)."
        )
    if device.is_emulation() and ("opt" in settings.scale_method or settings.dynamic):
        raise ValueError(
            f"QUANT_CONFIG={path}: dynamic quantization and the *_opt_* scale "
            "methods need Gaudi; in emulation use a static maxabs_hw, "
            "maxabs_pow2 or unit_scale config."
        )
