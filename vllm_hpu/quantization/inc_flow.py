"""Intel Neural Compressor's FP8 flow on the loaded model (``QUANT_CONFIG``):
MEASURE prepares it with observers on every linear and attention step, QUANTIZE
converts those to fp8 with the measured scales. The measurements are written
once, when the worker shuts down or when asked (``shutdown_inc``)."""

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from vllm.logger import init_logger

from vllm_hpu import device
from vllm_hpu.quantization import inc_emulation, inc_moe
from vllm_hpu.quantization.inc import IncSettings, inc_settings

if TYPE_CHECKING:
    from vllm.config import LoadConfig, VllmConfig

logger = init_logger("vllm.hpu.quantization")


def quantization_flow(vllm_config: "VllmConfig") -> "QuantizationFlow":
    """INC's flow when ``--quantization inc`` or QUANT_CONFIG asked for it."""
    settings = inc_settings(vllm_config)
    return QuantizationFlow() if settings is None else IncFlow(settings)


class QuantizationFlow:
    """What the loaded model goes through before serving; without INC, nothing."""

    replaces_linears = False  # the runner may pack the linear weights

    def loading(self, load_config: "LoadConfig") -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def apply(self, model: torch.nn.Module, to: torch.device) -> torch.nn.Module:
        return model

    def finalize(self) -> None:
        pass


class IncFlow(QuantizationFlow):
    replaces_linears = True

    def __init__(self, settings: IncSettings) -> None:
        self.settings = settings
        self.measured: torch.nn.Module | None = None  # until its files are written

    @contextlib.contextmanager
    def loading(self, load_config: "LoadConfig") -> Iterator[None]:
        """QUANTIZE loads on the host unless told where: INC's convert moves each layer
        to the card as it quantizes it (MEASURE: INC's prepare moves the bf16 model)."""
        chosen = load_config.device
        load_config.device = chosen or (None if self.settings.measures else "cpu")
        yield
        load_config.device = chosen  # a draft model loads where vLLM puts it

    def apply(self, model: torch.nn.Module, to: torch.device) -> torch.nn.Module:
        """Prepare (MEASURE) or convert (QUANTIZE) the loaded model in place."""
        from neural_compressor.torch.quantization import FP8Config, convert, prepare

        started = time.perf_counter()
        enable_inc()
        config = FP8Config.from_json_file(self.settings.path)
        inc_moe.attach_moe_ops(model, detach=not self.settings.measures)
        if self.settings.measures:
            model = prepare(model, config)
            self.measured = model
        else:
            model = convert(model, config).to(to)
        device.mark_scales_const(model)
        _warn_left_in_bf16(model)
        logger.info(
            "Intel Neural Compressor %s (%s) took %.2f s.",
            "prepared the model for measurement"
            if self.settings.measures
            else "converted the model to fp8",
            self.settings.path,
            time.perf_counter() - started,
        )
        return model

    def finalize(self) -> None:
        """Write the measurement files (MEASURE only, once)."""
        if self.measured is None:
            return
        from neural_compressor.torch.quantization import finalize_calibration

        finalize_calibration(self.measured)
        self.measured = None
        logger.info(
            "Intel Neural Compressor wrote its measurements to %s_hooks_maxabs*.",
            self.settings.dump_stats_path,
        )


def _warn_left_in_bf16(model: torch.nn.Module) -> None:
    """One warning naming the layers INC has no module for (MoE routers, which
    vLLM keeps at full precision: on Gaudi too INC leaves them unpatched)."""
    from neural_compressor.torch.algorithms.fp8_quant.model_configs import (
        get_patched_module_table,
    )

    left = inc_moe.layers_inc_cannot_take(model, get_patched_module_table())
    if left:
        logger.warning(
            "Intel Neural Compressor has no FP8 module for these layers; they "
            "stay in bf16: %s.",
            left,
        )


def enable_inc() -> None:
    """Before Intel Neural Compressor prepares or converts a model: on Gaudi INC
    runs as it is; in emulation it is made to take its Gaudi path on the CPU."""
    if not device.hpu_available():
        inc_emulation.install()
