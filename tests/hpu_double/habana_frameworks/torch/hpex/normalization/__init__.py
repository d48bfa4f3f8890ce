"""habana_frameworks.torch.hpex.normalization (bridge v1.19.0)."""

from habana_frameworks.torch.hpex.normalization.FusedRMSNorm import (
    FusedRMSNorm,
    RmsNormBwdMode,
)

__all__ = ["FusedRMSNorm", "RmsNormBwdMode"]
