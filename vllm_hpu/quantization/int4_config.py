"""What the HPU configs of AWQ and GPTQ checkpoints share: the name they claim in
a checkpoint's ``quant_method``, float activations, and no device capability."""

from typing import Any, ClassVar

import torch
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig


class HpuInt4Config(QuantizationConfig):
    """Base of the 4-bit checkpoint configs; a subclass names its ``METHOD``."""

    METHOD: ClassVar[str]

    @classmethod
    def get_name(cls) -> Any:
        return cls.METHOD

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 0

    @classmethod
    def override_quantization_method(
        cls, hf_quant_cfg: dict[str, Any], user_quant: str | None, hf_config: Any = None
    ) -> Any:
        """Claims ``METHOD``'s checkpoints: vLLM's own methods need CUDA kernels."""
        if hf_quant_cfg.get("quant_method", "").lower() != cls.METHOD:
            return None
        return cls.METHOD if user_quant in (None, cls.METHOD) else None
