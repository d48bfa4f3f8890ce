"""habana_frameworks.torch.hpex.kernels: the fused kernels the plugin, vLLM's
Gaudi path and INC use (bridge v1.19.0 hpex/kernels/__init__.py)."""

from habana_frameworks.torch.hpex.kernels.FusedSDPA import FusedSDPA
from habana_frameworks.torch.hpex.kernels.RotaryPosEmbeddingHelper import (
    RotaryPosEmbeddingHelperV1,
    RotaryPosEmbeddingHelperV2,
    RotaryPosEmbeddingMode,
    apply_rotary_pos_emb,
)

__all__ = [
    "FusedSDPA",
    "RotaryPosEmbeddingHelperV1",
    "RotaryPosEmbeddingHelperV2",
    "RotaryPosEmbeddingMode",
    "apply_rotary_pos_emb",
]
