"""FP8 linear layers on HPU: vLLM's online per-tensor FP8 (``--quantization
fp8``) and the kernels vLLM selects for ``fp8`` and compressed-tensors
W8A8-FP8 checkpoints: per-tensor or per-channel weight scales with static or
dynamic activation scales, and block scales (DeepSeek's ``weight_scale_inv``).
The fp8 values stay on the device: Gaudi's fp8 matmul, or in emulation upcast
(exact: e4m3 fits in bf16) with the scales applied."""

import functools
from typing import Any

import torch
from vllm.model_executor.kernels.linear import (
    FP8ScaledMMLinearKernel,
    FP8ScaledMMLinearLayerConfig,
    register_linear_kernel,
)
from vllm.model_executor.kernels.linear.scaled_mm.BlockScaledMMLinearKernel import (
    Fp8BlockScaledMMLinearKernel,
)
from vllm.model_executor.layers.quantization.fp8 import Fp8Config
from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
from vllm.model_executor.layers.quantization.online import base as online_base
from vllm.model_executor.layers.quantization.online.fp8 import OnlineLinearBase
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    GroupShape,
    kFp8StaticTensorSym,
)
from vllm.model_executor.utils import replace_parameter
from vllm.platforms import PlatformEnum

from vllm_hpu import device
from vllm_hpu.quantization.dequant import (
    dequantize_fp8,
    expand_block_scales,
    scaled_matmul,
)

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = device.fp8_max()  # the card's e4m3 range: 240 on Gaudi2
_MIN_SCALE = 1e-12  # an all-zero tensor still gets a usable scale


def fit_card_range(weight: torch.Tensor, *scales: torch.Tensor | None) -> None:
    """Checkpoint fp8 values (up to 448) on a card with a smaller e4m3 range
    (Gaudi2: 240), in place: halved on the host (the card reads values past its
    range as NaN), their weight and static input scales doubled, as vllm-gaudi
    loads them (extension/ops.py:968-993). Nothing on other devices."""
    if torch.finfo(FP8_DTYPE).max <= FP8_MAX:
        return
    halved = (weight.detach().cpu().float() * 0.5).to(FP8_DTYPE)
    weight.data.copy_(halved)
    for scale in scales:
        if scale is not None:
            scale.data.mul_(2.0)


def quantize_per_tensor(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 t, float32 scale), t * scale ~= tensor, its max magnitude at fp8's max."""
    scale = (t.abs().amax().float() / FP8_MAX).clamp(min=_MIN_SCALE)
    q = (t.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def fp8_scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """(a * a_scale) @ (b * b_scale) + bias, fp8 ``a`` [M, K], ``b`` [K, N]; a_scale one
    or [M, 1], b_scale one or N elements (vLLM keeps [N, 1])."""
    gemm = device.fp8_gemm()
    if gemm is not None:
        return gemm(
            A=a,
            trans_A=False,
            B=b,
            trans_B=False,
            D=None,
            out_dtype=out_dtype,
            A_scale_inv=a_scale,
            # Per column is [N] (the bridge's fp8 tests): [N, 1] would scale B's rows.
            B_scale_inv=b_scale if b_scale.numel() == 1 else b_scale.reshape(-1),
            bias=bias,
            accumulate=False,
        )
    return scaled_matmul(a, b, a_scale, b_scale, out_dtype, bias)


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x @ weight.T of an fp8 (out, in) weight, x cast to fp8 per tensor."""
    xq, x_scale = quantize_per_tensor(x)
    return fp8_scaled_mm(xq, weight.t(), x_scale, weight_scale, x.dtype, bias)


class HpuFp8PerTensorOnlineLinearMethod(OnlineLinearBase):
    """vLLM's online per-tensor FP8 linear method without its CUDA kernels: the
    bf16 weight vLLM loads is cast to fp8 once, in process_weights_after_loading."""

    def process_weights_after_loading(self, layer: Any) -> None:
        if getattr(layer, "_already_called_process_weights_after_loading", False):
            return
        weight, scale = quantize_per_tensor(self.get_weight_for_quantization(layer))
        self.release_requantization_source_weights(layer)
        replace_parameter(layer, "weight", weight)
        layer.register_parameter(
            "weight_scale", torch.nn.Parameter(scale, requires_grad=False)
        )
        layer.input_scale = None
        layer._already_called_process_weights_after_loading = True

    def apply(
        self,
        layer: Any,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return fp8_linear(x, layer.weight, layer.weight_scale, bias)


class HpuFp8Config(Fp8Config):
    """vLLM's ``fp8`` checkpoint config, also running float32 activations (the 16-bit
    limit is CUDA's); registered via quantization/moe_configs.py's subclass."""

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]


class HpuFp8ScaledMMLinearKernel(FP8ScaledMMLinearKernel):
    """Per-tensor or per-channel fp8 weights ([K, N] once processed) times fp8 inputs:
    a static checkpoint scale, or per token whatever vLLM asks (as Gaudi's
    reference), so a sequence's output does not depend on its batch."""

    def __init__(self, c: FP8ScaledMMLinearLayerConfig, layer_param_names: Any):
        super().__init__(c, layer_param_names)
        if not c.activation_quant_key.scale.static:
            self.quant_fp8 = QuantFP8(static=False, group_shape=GroupShape.PER_TOKEN)

    @classmethod
    def is_supported(
        cls, compute_capability: int | None = None
    ) -> tuple[bool, str | None]:
        return True, None

    @classmethod
    def can_implement(cls, c: FP8ScaledMMLinearLayerConfig) -> tuple[bool, str | None]:
        weight = c.weight_quant_key.scale.group_shape
        if not (weight.is_per_tensor() or weight.is_per_channel()):
            return False, f"weight scales per {weight} are not per tensor or channel"
        activation = c.activation_quant_key.scale
        if activation.static and not activation.group_shape.is_per_tensor():
            return False, "static activation scales must be per tensor"
        return True, None

    def process_weights_after_loading(self, layer: Any) -> None:
        super().process_weights_after_loading(layer)
        weight, weight_scale, input_scale, _ = self._get_layer_params(layer)
        fit_card_range(weight, weight_scale, input_scale)

    def apply_scaled_mm(
        self,
        *,
        A: torch.Tensor,
        B: torch.Tensor,
        out_dtype: torch.dtype,
        As: torch.Tensor,
        Bs: torch.Tensor,
        bias: torch.Tensor | None,
        output_shape: list,
    ) -> torch.Tensor:
        return fp8_scaled_mm(A, B, As, Bs, out_dtype, bias).view(*output_shape)


class HpuFp8BlockScaledMMLinearKernel(Fp8BlockScaledMMLinearKernel):
    """Block-scaled fp8 weights [N, K], scales [ceil(N/bn), ceil(K/bk)], times inputs
    QuantFP8 quantized per token and ``bn`` group: both dequantized, multiplied."""

    @classmethod
    def is_supported(
        cls, compute_capability: int | None = None
    ) -> tuple[bool, str | None]:
        return True, None

    def process_weights_after_loading(self, layer: Any) -> None:
        super().process_weights_after_loading(layer)
        params = self._get_layer_params(layer)
        fit_card_range(params.weight, params.block_scale)

    def apply_block_scaled_mm(
        self,
        A: torch.Tensor,
        B: torch.Tensor,
        As: torch.Tensor,
        Bs: torch.Tensor,
    ) -> torch.Tensor:
        dtype = self.config.out_dtype
        group = (1, self.quant_fp8.group_size)
        x = A.float() * expand_block_scales(As.float(), A.shape, group)
        block = (self.weight_group_shape.row, self.weight_group_shape.col)
        weight = dequantize_fp8(B, Bs, block, dtype)
        return torch.matmul(x.to(dtype), weight.t())


@functools.cache
def register() -> None:
    """Checkpoint kernels via vLLM's registry (block: patches/fp8_kernels.py); the
    online config's hookless module-level table gets our per-tensor entry."""
    register_linear_kernel(HpuFp8ScaledMMLinearKernel, PlatformEnum.OOT, "fp8")
    methods: dict[Any, type] = online_base._ONLINE_LINEAR_METHODS
    methods[kFp8StaticTensorSym] = HpuFp8PerTensorOnlineLinearMethod
