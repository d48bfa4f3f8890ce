"""Weight-only experts packed as integers or MXFP4: compressed-tensors WNA16 (4 or
8 bits, groups or channels, zero points or not), MXFP4A16, gpt-oss's MXFP4 and
AutoAWQ / GPTQ layouts. Each forward dequantizes a group of experts with
quantization/dequant.py (see ``HpuQuantizedMoE``)."""

import abc
from fractions import Fraction
from typing import Any

import torch
from vllm.model_executor.layers.fused_moe import FusedMoEMethodBase
from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig
from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend
from vllm.model_executor.layers.fused_moe.routed_experts import (
    FusedMoeWeightScaleSupported,
)
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe import (  # noqa: E501
    CompressedTensorsMoEMethod,
)
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w4a4_mxfp4 import (  # noqa: E501
    CompressedTensorsW4A4Mxfp4MoEMethod,
)
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_wna16 import (  # noqa: E501
    CompressedTensorsWNA16MoEMethod,
)
from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4MoEMethod
from vllm.model_executor.utils import set_weight_attrs

from vllm_hpu.ops.fused_moe import refuse
from vllm_hpu.quantization import dequant
from vllm_hpu.quantization.moe_methods import HpuQuantizedMoE

MXFP4_GROUP_SIZE = dequant.MXFP4_GROUP_SIZE


class HpuCompressedTensorsWNA16MoEMethod(
    HpuQuantizedMoE, CompressedTensorsWNA16MoEMethod
):
    """compressed-tensors ``pack-quantized`` experts: ``w13_weight_packed`` int32 [E,
    N, K / pack], ``w13_weight_scale`` [E, N, groups], zeros [E, N / pack, groups]."""

    def __init__(self, weight_quant: Any, moe: FusedMoEConfig) -> None:
        # vLLM's __init__ asks for a CUDA or CPU kernel; create_weights reads these.
        CompressedTensorsMoEMethod.__init__(self, moe)
        self.weight_quant, self.input_quant = weight_quant, None
        self.symmetric = weight_quant.symmetric
        self.num_bits = weight_quant.num_bits
        self.packed_factor = Fraction(32, weight_quant.num_bits)
        self.strategy = weight_quant.strategy
        self.group_size = weight_quant.group_size or -1

    def dequantize(
        self, layer: Any, experts: slice | torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._dequantize(layer, "w13", experts, dtype), self._dequantize(
            layer, "w2", experts, dtype
        )

    def _dequantize(
        self, layer: Any, name: str, experts: slice | torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        zeros = getattr(layer, f"{name}_weight_zero_point", None)
        weight = dequant.dequantize_pack_quantized(
            getattr(layer, f"{name}_weight_packed")[experts],
            getattr(layer, f"{name}_weight_scale")[experts],
            self.num_bits,
            None if zeros is None else zeros[experts],
        )
        return weight.to(dtype)


class HpuCompressedTensorsMxfp4MoEMethod(
    HpuQuantizedMoE, CompressedTensorsW4A4Mxfp4MoEMethod
):
    """compressed-tensors MXFP4A16 experts: e2m1 pairs ``w13_weight_packed``
    uint8 [E, N, K / 2], e8m0 ``w13_weight_scale`` uint8 [E, N, K / 32]."""

    def __init__(self, moe: FusedMoEConfig) -> None:
        # vLLM's __init__ picks a CUDA/XPU kernel; create_weights reads the group size.
        CompressedTensorsMoEMethod.__init__(self, moe)
        self.group_size = MXFP4_GROUP_SIZE

    def dequantize(
        self, layer: Any, experts: slice | torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return mxfp4_experts(layer, "weight_packed", experts, dtype)


class HpuGptOssMxfp4MoEMethod(HpuQuantizedMoE, GptOssMxfp4MoEMethod):
    """gpt-oss's MXFP4 experts (``mxfp4``) as vLLM's loader fills them: e2m1 pairs
    ``w13_weight`` uint8 [E, 2 * I, H / 2] (gate/up interleaved), e8m0
    ``w13_weight_scale`` [E, 2 * I, H / 32], ``w2_*`` alike, bf16 biases."""

    def __init__(self, moe: FusedMoEConfig) -> None:
        # vLLM's __init__ asks its oracle for a GPU kernel. Its loader packs
        # the blocks by ``weight_dtype``; its ``maybe_roundup_sizes`` rounds
        # the sizes to whole 32-value blocks for the emulation backend.
        FusedMoEMethodBase.__init__(self, moe)
        self.weight_dtype = "gpt_oss_mxfp4"
        self.mxfp4_backend = Mxfp4MoeBackend.EMULATION

    def dequantize(
        self, layer: Any, experts: slice | torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return mxfp4_experts(layer, "weight", experts, dtype)


def mxfp4_experts(
    layer: Any, codes: str, experts: slice | torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """w13 and w2 of ``experts`` from e2m1 codes and e8m0 scales, in ``dtype``."""
    w13, w2 = (
        dequant.dequantize_mxfp4(
            getattr(layer, f"{name}_{codes}")[experts],
            getattr(layer, f"{name}_weight_scale")[experts],
            dtype,
        )
        for name in ("w13", "w2")
    )
    return w13, w2


class HpuInt4CheckpointMoEMethod(HpuQuantizedMoE, FusedMoEMethodBase):
    """AutoAWQ or GPTQ experts as stacked in the checkpoint (input first:
    ``is_transposed``), scales [E, groups, N]; subclasses name and dequantize."""

    def __init__(self, quant_config: Any, moe: FusedMoEConfig) -> None:
        super().__init__(moe)
        self.quant_config = quant_config

    def group_size(self, inputs: int) -> int:
        size = self.quant_config.group_size
        return inputs if size == -1 else size

    def register(
        self, layer: Any, name: str, shape: tuple[int, ...], **attrs: Any
    ) -> None:
        dtype = attrs.pop("dtype", torch.int32)
        param = torch.nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
        layer.register_parameter(name, param)
        set_weight_attrs(param, {"is_transposed": True, **attrs})

    def create_weights(
        self,
        layer: Any,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        """w13 maps hidden_size inputs to 2 x intermediate outputs, w2 back."""
        intermediate = intermediate_size_per_partition
        group = FusedMoeWeightScaleSupported.GROUP.value
        for name, inputs, outputs in (
            ("w13", hidden_size, 2 * intermediate),
            ("w2", intermediate, hidden_size),
        ):
            if inputs % self.group_size(inputs) or outputs % dequant.pack_factor(4):
                refuse(
                    f"4-bit experts of {inputs} inputs in groups of "
                    f"{self.group_size(inputs)} (or {outputs} outputs in packs of 8)",
                    "use a tensor-parallel size that keeps whole groups per device",
                )
            groups = inputs // self.group_size(inputs)
            shape = (num_experts, *self.qweight_shape(inputs, outputs))
            self.register(layer, f"{name}_qweight", shape, **extra_weight_attrs)
            self.register(
                layer, f"{name}_scales", (num_experts, groups, outputs),
                dtype=params_dtype, quant_method=group, **extra_weight_attrs,
            )  # fmt: skip
            self.register(
                layer, f"{name}_qzeros",
                (num_experts, groups, outputs // dequant.pack_factor(4)),
                quant_method=group, **extra_weight_attrs,
            )  # fmt: skip

    @abc.abstractmethod
    def qweight_shape(self, inputs: int, outputs: int) -> tuple[int, int]:
        """One expert's packed weight, as the format stores it."""


class HpuAWQMoEMethod(HpuInt4CheckpointMoEMethod):
    """AutoAWQ GEMM experts: ``qweight`` [E, K, N / 8] and ``qzeros``
    [E, groups, N / 8] packed along the output in AWQ's nibble order."""

    def qweight_shape(self, inputs: int, outputs: int) -> tuple[int, int]:
        return inputs, outputs // dequant.pack_factor(4)

    def dequantize(
        self, layer: Any, experts: slice | torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        w13, w2 = (
            dequant.dequantize_awq(
                getattr(layer, f"{name}_qweight")[experts],
                getattr(layer, f"{name}_qzeros")[experts],
                getattr(layer, f"{name}_scales")[experts],
            )
            for name in ("w13", "w2")
        )
        return w13.transpose(1, 2).to(dtype), w2.transpose(1, 2).to(dtype)


class HpuGPTQMoEMethod(HpuInt4CheckpointMoEMethod):
    """GPTQ experts without act-order: ``qweight`` [E, K / 8, N] packed along the
    input, ``qzeros`` [E, groups, N / 8] (unused when symmetric: zero 8)."""

    def qweight_shape(self, inputs: int, outputs: int) -> tuple[int, int]:
        return inputs // dequant.pack_factor(4), outputs

    def dequantize(
        self, layer: Any, experts: slice | torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        weights = []
        for name in ("w13", "w2"):
            qweight = getattr(layer, f"{name}_qweight")[experts]
            zeros = getattr(layer, f"{name}_qzeros")[experts]
            weight = dequant.dequantize_gptq(
                qweight,
                None if self.quant_config.sym else zeros,
                getattr(layer, f"{name}_scales")[experts],
                None,  # GPTQ experts have no desc_act: consecutive groups
                v1=self.quant_config.v1,
            )
            weights.append(weight.transpose(1, 2).to(dtype))
        return weights[0], weights[1]
