"""AutoAWQ checkpoints (4-bit, GEMM layout, zero points) on HPU: the weights stay
packed in device memory and are dequantized in plain torch inside the forward."""

from typing import Any

import torch
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.layers.linear import (
    LinearBase,
    LinearMethodBase,
    UnquantizedLinearMethod,
    register_weight_loader_v2_supported_method,
)
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    is_layer_skipped,
)
from vllm.model_executor.parameter import (
    GroupQuantScaleParameter,
    PackedvLLMParameter,
)

from vllm_hpu.ops.fused_moe import check_supported
from vllm_hpu.quantization import int4
from vllm_hpu.quantization.dequant import dequantize_awq
from vllm_hpu.quantization.int4_config import HpuInt4Config
from vllm_hpu.quantization.packed_moe import HpuAWQMoEMethod


class HpuAWQConfig(HpuInt4Config):
    """The ``quantization_config`` of an AutoAWQ checkpoint, GEMM variant only."""

    METHOD = "awq"

    def __init__(self, group_size: int, modules_to_not_convert: list[str]) -> None:
        super().__init__()
        self.group_size = group_size
        self.modules_to_not_convert = modules_to_not_convert

    def __repr__(self) -> str:
        return f"HpuAWQConfig(group_size={self.group_size})"

    @staticmethod
    def get_config_filenames() -> list[str]:
        return ["quant_config.json", "quantize_config.json"]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "HpuAWQConfig":
        int4.check_bits("AWQ", cls.get_from_keys(config, ["w_bit", "bits"]))
        version = str(cls.get_from_keys_or(config, ["version"], "gemm")).lower()
        if version != "gemm":
            raise ValueError(
                f"AWQ version {version!r} is not supported on HPU: only the GEMM "
                "layout is. Re-export the checkpoint with AutoAWQ's version='gemm'."
            )
        if not cls.get_from_keys_or(config, ["zero_point"], True):
            raise ValueError(
                "AWQ without zero points (zero_point=false) is not supported on HPU; "
                "use a checkpoint quantized with zero_point=true."
            )
        if cls.get_from_keys_or(config, ["lm_head"], False):
            raise ValueError(
                "AWQ checkpoints with a quantized lm_head are not supported on HPU; "
                "use one whose lm_head is left in 16 bits."
            )
        group_size = cls.get_from_keys(config, ["q_group_size", "group_size"])
        skipped = cls.get_from_keys_or(config, ["modules_to_not_convert"], None)
        return cls(group_size, skipped or [])

    def get_quant_method(
        self, layer: torch.nn.Module, prefix: str
    ) -> QuantizeMethodBase | None:
        if not isinstance(layer, (LinearBase, RoutedExperts)):
            return None
        if is_layer_skipped(
            prefix,
            self.modules_to_not_convert,
            self.packed_modules_mapping,
            match_mode="substring",
        ):
            return (
                None if isinstance(layer, RoutedExperts) else UnquantizedLinearMethod()
            )
        if isinstance(layer, RoutedExperts):
            check_supported(layer.moe_config)
            return HpuAWQMoEMethod(self, layer.moe_config)
        return HpuAWQLinearMethod(self)


@register_weight_loader_v2_supported_method
class HpuAWQLinearMethod(LinearMethodBase):
    """y = x @ dequant(qweight); qweight (in, out / 8) and qzeros (groups, out / 8)
    are packed along the output in AutoAWQ's nibble order, scales (groups, out)."""

    def __init__(self, quant_config: HpuAWQConfig) -> None:
        self.quant_config = quant_config

    def create_weights(
        self,
        layer: Any,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        group_size = self.quant_config.group_size
        group_size = input_size if group_size == -1 else group_size
        rows, cols = input_size_per_partition, sum(output_partition_sizes)
        if rows % group_size or cols % int4.PACK_FACTOR:
            raise ValueError(
                f"AWQ layer of shape ({rows}, {cols}) does not split into groups of "
                f"{group_size} inputs and packs of {int4.PACK_FACTOR} outputs; "
                "use a tensor-parallel size that keeps whole groups per device."
            )
        loader = extra_weight_attrs["weight_loader"]
        packed = {"input_dim": 0, "output_dim": 1, "packed_dim": 1}
        packed |= {"packed_factor": int4.PACK_FACTOR, "weight_loader": loader}
        groups, packed_cols = rows // group_size, cols // int4.PACK_FACTOR
        layer.register_parameter(
            "qweight",
            PackedvLLMParameter(
                data=torch.empty(rows, packed_cols, dtype=torch.int32), **packed
            ),
        )
        layer.register_parameter(
            "qzeros",
            PackedvLLMParameter(
                data=torch.empty(groups, packed_cols, dtype=torch.int32), **packed
            ),
        )
        scales = torch.empty(groups, cols, dtype=params_dtype)
        layer.register_parameter(
            "scales",
            GroupQuantScaleParameter(
                data=scales, input_dim=0, output_dim=1, weight_loader=loader
            ),
        )

    def process_weights_after_loading(self, layer: Any) -> None:
        for name in ("qweight", "qzeros", "scales"):
            param = getattr(layer, name)
            setattr(layer, name, torch.nn.Parameter(param.data, requires_grad=False))

    def apply(
        self,
        layer: Any,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        weight = dequantize_awq(layer.qweight, layer.qzeros, layer.scales)
        out = torch.matmul(x, weight.to(x.dtype))
        return out if bias is None else out + bias


def register() -> None:
    """Serve ``quant_method: awq`` with this config (vLLM tries "auto_awq" first)."""
    for name in ("awq", "auto_awq"):
        register_quantization_config(name)(HpuAWQConfig)
