"""AutoGPTQ checkpoints (4-bit, symmetric or not, with or without desc_act) on
HPU: weights stay packed in device memory, dequantized in the forward."""

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
from vllm.model_executor.layers.quantization.utils.gptq_utils import (
    is_layer_gptq_quantized,
)
from vllm.model_executor.models.utils import WeightsMapper
from vllm.model_executor.parameter import (
    ChannelQuantScaleParameter,
    GroupQuantScaleParameter,
    PackedColumnParameter,
    PackedvLLMParameter,
    RowvLLMParameter,
)

from vllm_hpu.ops.fused_moe import check_supported, refuse
from vllm_hpu.quantization import int4
from vllm_hpu.quantization.dequant import dequantize_gptq
from vllm_hpu.quantization.int4_config import HpuInt4Config
from vllm_hpu.quantization.packed_moe import HpuGPTQMoEMethod


class HpuGPTQConfig(HpuInt4Config):
    """The ``quantization_config`` of a GPTQ checkpoint (``gptq`` v1 format, whose
    qzeros hold zero - 1, or ``gptq_v2``, whose qzeros hold the zero itself)."""

    METHOD = "gptq"

    def __init__(self, group_size: int, desc_act: bool, sym: bool, v1: bool) -> None:
        super().__init__()
        self.group_size = group_size
        self.desc_act = desc_act
        self.sym = sym
        self.v1 = v1
        self.modules_in_block_to_quantize: list[Any] = []

    def __repr__(self) -> str:
        return (
            f"HpuGPTQConfig(group_size={self.group_size}, desc_act={self.desc_act}, "
            f"sym={self.sym}, v1={self.v1})"
        )

    @staticmethod
    def get_config_filenames() -> list[str]:
        return ["quantize_config.json"]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "HpuGPTQConfig":
        int4.check_bits("GPTQ", cls.get_from_keys(config, ["bits"]))
        _refuse_variants(config)
        fmt = str(cls.get_from_keys_or(config, ["checkpoint_format"], "gptq"))
        quant = cls(
            cls.get_from_keys(config, ["group_size"]),
            bool(cls.get_from_keys_or(config, ["desc_act"], False)),
            bool(cls.get_from_keys_or(config, ["sym"], True)),
            v1=fmt != "gptq_v2",
        )
        blocks = cls.get_from_keys_or(config, ["modules_in_block_to_quantize"], None)
        quant.modules_in_block_to_quantize = blocks or []
        return quant

    def get_checkpoint_weight_mapper(self) -> WeightsMapper:  # type: ignore[override]
        """Keeps g_idx where desc_act needs it (vLLM drops it by default)."""
        return (
            WeightsMapper() if self.desc_act else super().get_checkpoint_weight_mapper()
        )

    def get_quant_method(
        self, layer: torch.nn.Module, prefix: str
    ) -> QuantizeMethodBase | None:
        if not isinstance(layer, (LinearBase, RoutedExperts)):
            return None
        blocks = self.modules_in_block_to_quantize
        if not is_layer_gptq_quantized(prefix, blocks, self.packed_modules_mapping):
            return (
                None if isinstance(layer, RoutedExperts) else UnquantizedLinearMethod()
            )
        if isinstance(layer, RoutedExperts):
            return self.moe_method(layer)
        return HpuGPTQLinearMethod(self)

    def moe_method(self, layer: RoutedExperts) -> HpuGPTQMoEMethod:
        if self.desc_act:
            refuse(
                "GPTQ experts with desc_act (act-order)",
                "use a GPTQ checkpoint quantized with desc_act=false",
            )
        check_supported(layer.moe_config)
        return HpuGPTQMoEMethod(self, layer.moe_config)


def _refuse_variants(config: dict[str, Any]) -> None:
    """Start-up errors for GPTQ variants this plugin does not run."""
    fmt = str(config.get("checkpoint_format", "gptq"))
    if config.get("is_marlin_format") or fmt not in ("gptq", "gptq_v2"):
        raise ValueError(
            f"GPTQ checkpoint format {fmt!r} (Marlin-packed) is not supported on "
            "HPU; use the checkpoint in AutoGPTQ's plain 'gptq' format."
        )
    if config.get("dynamic"):
        raise ValueError(
            "GPTQModel's per-module 'dynamic' overrides are not supported on HPU; "
            "use a checkpoint quantized with one bit width and group size."
        )
    if config.get("lm_head"):
        raise ValueError(
            "GPTQ checkpoints with a quantized lm_head are not supported on HPU; "
            "use one whose lm_head is left in 16 bits."
        )


@register_weight_loader_v2_supported_method
class HpuGPTQLinearMethod(LinearMethodBase):
    """y = x @ dequant(qweight): qweight (in / 8, out) packed along the input, qzeros
    (groups, out / 8), scales (groups, out), g_idx per input row under desc_act."""

    def __init__(self, quant_config: HpuGPTQConfig) -> None:
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
        config = self.quant_config
        group_size = input_size if config.group_size == -1 else config.group_size
        rows, cols = input_size_per_partition, sum(output_partition_sizes)
        if rows % group_size or rows % int4.PACK_FACTOR or cols % int4.PACK_FACTOR:
            raise ValueError(
                f"GPTQ layer of shape ({rows}, {cols}) does not split into groups of "
                f"{group_size} inputs and packs of {int4.PACK_FACTOR}; use a "
                "tensor-parallel size that keeps whole groups per device."
            )
        loader = extra_weight_attrs["weight_loader"]
        layer.register_parameter(
            "qweight",
            PackedvLLMParameter(
                data=torch.empty(rows // int4.PACK_FACTOR, cols, dtype=torch.int32),
                input_dim=0,
                output_dim=1,
                packed_dim=0,
                packed_factor=int4.PACK_FACTOR,
                weight_loader=loader,
            ),
        )
        g_idx = torch.empty(rows, dtype=torch.int32)
        layer.register_parameter(
            "g_idx", RowvLLMParameter(data=g_idx, input_dim=0, weight_loader=loader)
        )
        # desc_act's g_idx names groups of the whole input: every rank keeps them all.
        replicated = config.desc_act or (config.group_size == -1 and rows != input_size)
        groups = (input_size if replicated else rows) // group_size
        _register_group_params(layer, groups, cols, params_dtype, replicated, loader)

    def process_weights_after_loading(self, layer: Any) -> None:
        names = ("qweight", "qzeros", "scales", "g_idx")
        for name in names:
            param = getattr(layer, name)
            setattr(layer, name, torch.nn.Parameter(param.data, requires_grad=False))

    def apply(
        self,
        layer: Any,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        config = self.quant_config
        qzeros = None if config.sym else layer.qzeros
        # Without desc_act the groups are consecutive rows of this partition.
        g_idx = layer.g_idx if config.desc_act else None
        weight = dequantize_gptq(layer.qweight, qzeros, layer.scales, g_idx, config.v1)
        out = torch.matmul(x, weight.to(x.dtype))
        return out if bias is None else out + bias


def _register_group_params(
    layer: torch.nn.Module,
    groups: int,
    cols: int,
    dtype: torch.dtype,
    replicated: bool,
    loader: Any,
) -> None:
    qzeros = torch.empty(groups, cols // int4.PACK_FACTOR, dtype=torch.int32)
    scales = torch.empty(groups, cols, dtype=dtype)
    packing = {"packed_dim": 1, "packed_factor": int4.PACK_FACTOR}
    if replicated:
        zeros_param: Any = PackedColumnParameter(
            data=qzeros, output_dim=1, weight_loader=loader, **packing
        )
        scales_param: Any = ChannelQuantScaleParameter(
            data=scales, output_dim=1, weight_loader=loader
        )
    else:
        zeros_param = PackedvLLMParameter(
            data=qzeros, input_dim=0, output_dim=1, weight_loader=loader, **packing
        )
        scales_param = GroupQuantScaleParameter(
            data=scales, input_dim=0, output_dim=1, weight_loader=loader
        )
    layer.register_parameter("qzeros", zeros_param)
    layer.register_parameter("scales", scales_param)


def register() -> None:
    """Serve ``quant_method: gptq`` with this config (vLLM tries "auto_gptq" first)."""
    for name in ("gptq", "auto_gptq"):
        register_quantization_config(name)(HpuGPTQConfig)
