"""``--quantization inc`` claimed for Intel Neural Compressor's FP8 flow: vLLM
0.32's own ``inc`` is the unrelated auto-round checkpoint format."""

from typing import Any

import torch
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization import (
    QuantizationMethods,
    register_quantization_config,
)
from vllm.model_executor.layers.quantization.base_config import (
    QuantizationConfig,
    QuantizeMethodBase,
)


class HpuIncConfig(QuantizationConfig):
    """``--quantization inc``: the weights load unquantized; INC then measures
    or converts the loaded model (vLLM's own ``inc`` is the auto-round format)."""

    def get_name(self) -> "QuantizationMethods":
        return "inc"

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16]

    @classmethod
    def get_min_capability(cls) -> int:
        return 0

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []  # the config is QUANT_CONFIG, not a file of the checkpoint

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "HpuIncConfig":
        return cls()

    def get_quant_method(
        self, layer: torch.nn.Module, prefix: str
    ) -> QuantizeMethodBase | None:
        return UnquantizedLinearMethod() if isinstance(layer, LinearBase) else None


def register() -> None:
    register_quantization_config("inc")(HpuIncConfig)
