"""Intel Neural Compressor's Gaudi FP8 path on the CPU, for emulation only.
Why: INC has no CPU backend for it. How (docs/fp8.md): Gaudi module entries in
INC's CPU table, torch stand-ins for the fp8 ops (the fused MoE measuring op as
a ``torch.ops.hpu`` op) and a config parser taking the real path with Gaudi 3
scales, set by ``inc_flow.enable_inc``. Removed by: an INC CPU accelerator."""

import functools
from collections.abc import Callable
from typing import Any

import torch

from vllm_hpu.ops.activations import gated

FP8 = torch.float8_e4m3fn
FP32 = torch.float32
SDPA_QUERY_CHUNK = 512  # query rows per step of the emulated fused kernel
# INC's HPU module entries with no stand-in here: transformers' and older vLLM's
# MoE blocks, fp8-weight checkpoints' MoE modules, Gaudi-only kernels.
GAUDI_ONLY_MODULES = (
    "FusedMoE",
    "SharedFusedMoE",
    "GaudiMixtralSparseMoeBlock",
    "GaudiDeepseekV3MoE",
    "GaudiFP8Linear",
    "MoeFP8Matmul",
    "VllmMixtureOfExpertsOpFP8",
    "VllmMixtureOfExpertsOpFP8PerChannel",
    "BlockSoftmaxConstMax",
)
MOE_MEASUREMENT_OP = "mixture_of_experts.fp8_measurement_fused_weights"
MOE_MEASUREMENT_SCHEMA = (
    "(Tensor hidden_states, Tensor expert_routing_table, Tensor router_weights, "
    "Tensor[] w12, Tensor[] w3, bool permuted_weights, str activation, "
    "int experts_min, int experts_max, bool measurement_mode) -> (Tensor, Tensor)"
)
_libraries: list[torch.library.Library] = []  # keeps the stand-in op defined
SCALES_OF = "GAUDI3"  # the Gaudi generation whose scale steps are emulated


def _quantize(x: torch.Tensor, scale_inv: Any, dtype: torch.dtype) -> torch.Tensor:
    """x * scale_inv saturated to the fp8 range (a plain cast would give NaN)."""
    limit = torch.finfo(dtype).max
    scaled = x.float() if scale_inv is None else x.float() * scale_inv
    return scaled.clamp(-limit, limit).to(dtype)


def _dequantize(x: torch.Tensor, scale: Any, dtype: torch.dtype) -> torch.Tensor:
    upcast = x.float()
    return (upcast if scale is None else upcast * scale).to(dtype)


def cast_to_fp8(
    input: torch.Tensor,
    scale_inv: Any = None,
    stochastic_rounding: bool = False,
    is_amax: bool = False,
    dtype: torch.dtype = FP8,
) -> torch.Tensor:
    """torch.ops.hpu.cast_to_fp8_v2 (its first output)."""
    return _quantize(input, scale_inv, dtype)


def cast_from_fp8(
    input: torch.Tensor, scale: Any = None, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """torch.ops.hpu.cast_from_fp8."""
    return _dequantize(input, scale, out_dtype)


def fp8_gemm(
    input: torch.Tensor,
    other: torch.Tensor,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    scale_input_inv: Any = None,
    scale_other_inv: Any = None,
) -> torch.Tensor:
    """torch.ops.hpu.fp8_gemm_v2 as INC calls it: both operands upcast (an fp8
    matmul on the CPU silently returns fp8), multiplied, then both scales."""
    result = torch.matmul(
        _dequantize(input, scale_input_inv, torch.float32),
        _dequantize(other, scale_other_inv, torch.float32),
    ).to(out_dtype)
    return result if out is None else out.copy_(result)


def softmax_fp8(
    x: torch.Tensor,
    dim: int,
    scale_input: Any,
    scale_output: Any,
    inv_attn_head: Any = None,
) -> torch.Tensor:
    """torch.ops.hpu.softmax_fp8: softmax of the descaled input, quantized."""
    probs = torch.softmax(_dequantize(x, scale_input, torch.float32), dim=dim)
    return _quantize(probs, scale_output, FP8)


def fp8_fused_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    softmax_mode: str = "None",
    d_scale_q: Any = None,
    d_scale_k: Any = None,
    d_scale_v: Any = None,
    q_scale_s: Any = None,
    q_scale_o: Any = None,
    d_scale_s: Any = None,
    is_amax_s: bool = False,
    **unused: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gaudi's fp8_fused_sdpa: q, k, v [bs, heads, len, D] dequantized, probabilities
    via ``q_scale_s``, output ``q_scale_o``; (output, amax or None), chunked."""
    group = q.shape[1] // k.shape[1]
    key = _dequantize(k, d_scale_k, torch.float32).repeat_interleave(group, 1)
    value = _dequantize(v, d_scale_v, torch.float32).repeat_interleave(group, 1)
    outs, amax = [], torch.zeros(1)
    for start in range(0, q.shape[2], SDPA_QUERY_CHUNK):
        rows = slice(start, start + SDPA_QUERY_CHUNK)
        query = _dequantize(q[:, :, rows], d_scale_q, torch.float32)
        scores = torch.matmul(query, key.transpose(-1, -2)) * (scale or 1.0)
        if attn_mask is not None:
            scores = scores + attn_mask[:, :, rows].float()
        probs = torch.softmax(scores, dim=-1)
        amax = torch.maximum(amax, probs.amax().reshape(1))
        if q_scale_s is not None:
            probs = _dequantize(_quantize(probs, q_scale_s, FP8), d_scale_s, FP32)
        outs.append(torch.matmul(probs, value))
    out = torch.cat(outs, dim=2)
    amax_s = amax if is_amax_s else None
    if q_scale_o is not None:
        return _quantize(out, q_scale_o, FP8), amax_s
    return out.to(torch.bfloat16 if q.dtype == FP8 else q.dtype), amax_s


def _routed_experts(
    x: torch.Tensor,
    routing: tuple[torch.Tensor, torch.Tensor, int],
    w12: list[torch.Tensor],
    w3: list[torch.Tensor],
    activation: str,
    intermediate: Callable[[int, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Gaudi's fused MoE on float32 operands, expert by expert: x [num_tokens,
    hidden]; routing = (expert ids, weights [num_tokens, top_k], id of w12[0]);
    w12[e] [in, 2 * intermediate] and w3[e] [intermediate, out] (unpermuted);
    ``intermediate(e, h)`` sees each expert's activated rows before w3."""
    expert_ids, weights, experts_min = routing
    out = torch.zeros(x.shape, dtype=FP32)
    for expert, (w_in, w_out) in enumerate(zip(w12, w3, strict=True)):
        tokens, slots = (expert_ids == experts_min + expert).nonzero(as_tuple=True)
        h = intermediate(expert, gated(x[tokens] @ w_in, activation))
        out.index_add_(0, tokens, (h @ w_out) * weights[tokens, slots, None].float())
    return out


def _unpermuted(weights: list[torch.Tensor], permuted: bool) -> list[torch.Tensor]:
    """Gaudi's ``permuted_weights``: [out, in] (nn.Linear's layout) when True."""
    return [w.float().t() if permuted else w.float() for w in weights]


def moe_measurement(
    hidden_states: torch.Tensor,
    expert_routing_table: torch.Tensor,
    router_weights: torch.Tensor,
    w12: list[torch.Tensor],
    w3: list[torch.Tensor],
    permuted_weights: bool,
    activation: str,
    experts_min: int,
    experts_max: int,
    measurement_mode: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.ops.hpu.mixture_of_experts.fp8_measurement_fused_weights: the
    unquantized experts' output and each expert's intermediate max-abs [E]."""
    amax = torch.zeros(len(w12), dtype=FP32)

    def measure(expert: int, h: torch.Tensor) -> torch.Tensor:
        if h.numel():
            amax[expert] = h.abs().amax()
        return h

    routing = (expert_routing_table, router_weights, experts_min)
    out = _routed_experts(
        hidden_states.float(),
        routing,
        _unpermuted(w12, permuted_weights),
        _unpermuted(w3, permuted_weights),
        activation,
        measure,
    )
    return out.to(hidden_states.dtype), amax


def fp8_moe(
    hidden_states: torch.Tensor,
    expert_routing_table: torch.Tensor,
    router_weights: torch.Tensor,
    w12: list[torch.Tensor],
    w3: list[torch.Tensor],
    d_scale_w12: list[Any],
    d_scale_w3: list[Any],
    d_scale_hidden_states: Any,
    d_scale_intermediate_hidden_states: list[Any],
    permuted_weights: bool = False,
    activation: str = "silu",
    experts_min: int = 0,
    experts_max: int = 0,
) -> torch.Tensor:
    """``mixture_of_experts.fp8_fused_weights``: fp8 tokens and experts dequantized,
    each expert's intermediate rounded through fp8 with its scale; bf16 out."""
    w_in = [_dequantize(w, s, FP32) for w, s in zip(w12, d_scale_w12, strict=True)]
    w_out = [_dequantize(w, s, FP32) for w, s in zip(w3, d_scale_w3, strict=True)]

    def requantize(expert: int, h: torch.Tensor) -> torch.Tensor:
        scale = d_scale_intermediate_hidden_states[expert]
        return _dequantize(_quantize(h, 1.0 / scale, FP8), scale, FP32)

    out = _routed_experts(
        _dequantize(hidden_states, d_scale_hidden_states, FP32),
        (expert_routing_table, router_weights, experts_min),
        _unpermuted(w_in, permuted_weights),
        _unpermuted(w_out, permuted_weights),
        activation,
        requantize,
    )
    return out.to(torch.bfloat16)


def _wrapper(function: Any) -> type:
    """An INC op-wrapper class calling ``function`` (INC makes one per op type)."""
    from neural_compressor.torch.algorithms.fp8_quant._core.quantized_func_wrappers.cpu.cpu_quantized_func_wrapper import (  # noqa: E501
        QuantizedCPUFuncWrapperBase,
    )

    return type(
        f"Emulated_{function.__name__}",
        (QuantizedCPUFuncWrapperBase,),
        {"get_default_quantized_func": lambda self: function},
    )


def _add_module_entries() -> None:
    """1. The HPU table's vLLM and attention modules in the CPU table."""
    from neural_compressor.torch.algorithms.fp8_quant._core import patching_common
    from neural_compressor.torch.algorithms.fp8_quant.model_configs import (
        PATCHED_MODULE_TABLE,
        PATCHED_MODULE_TYPES_TABLE,
    )

    entries = {
        name: info
        for name, info in patching_common._mod_default_dict.items()
        if name not in GAUDI_ONLY_MODULES
    }
    PATCHED_MODULE_TABLE["cpu"].update(entries)
    PATCHED_MODULE_TYPES_TABLE["cpu"].update(patching_common._mod_types)


def _add_op_wrappers() -> None:
    """2. Torch stand-ins for the Gaudi fp8 ops in INC's CPU op table."""
    from neural_compressor.torch.algorithms.fp8_quant._core.quantized_func_wrappers.cpu import (  # noqa: E501
        cpu_quantized_func_wrapper as cpu_wrappers,
    )
    from neural_compressor.torch.algorithms.fp8_quant._core.quantized_func_wrappers.quantized_func_wrapper import (  # noqa: E501
        OP_TYPE,
    )

    cpu_wrappers._OP_TYPE_CPU_QUANTIZED_WRAPPER_CLASSES.update(
        {
            OP_TYPE.LINEAR_GEMM: _wrapper(fp8_gemm),
            OP_TYPE.MATMUL_GEMM: _wrapper(fp8_gemm),
            OP_TYPE.SOFTMAX: _wrapper(softmax_fp8),
            OP_TYPE.FSDPA: _wrapper(fp8_fused_sdpa),
            OP_TYPE.CAST_TO_FP8: _wrapper(cast_to_fp8),
            OP_TYPE.CAST_FROM_FP8: _wrapper(cast_from_fp8),
            OP_TYPE.DYNAMIC_MOE_FUSED_WEIGHTS: _wrapper(fp8_moe),
        }
    )


def _define_moe_measurement() -> None:
    """2b. INC's MoE measurement calls the Gaudi op directly, so the stand-in is that
    ``torch.ops.hpu`` op (free without the bridge; emulation only)."""
    library = torch.library.Library("hpu", "FRAGMENT")
    library.define(MOE_MEASUREMENT_OP + MOE_MEASUREMENT_SCHEMA)
    library.impl(MOE_MEASUREMENT_OP, moe_measurement, "CompositeExplicitAutograd")
    _libraries.append(library)


def _accept_real_path() -> None:
    """3. The parser takes real (non-QDQ) quantization on the CPU, with a Gaudi
    generation's scale steps unless the JSON names one (``device_for_scales``)."""
    from neural_compressor.torch.algorithms.fp8_quant._quant_common.quant_config import (  # noqa: E501
        Fp8cfg,
    )
    from neural_compressor.torch.utils.auto_accelerator import INCAcceleratorType

    parse = Fp8cfg.parse

    def parse_real_path(custom_config: dict[str, Any]) -> Any:
        use_qdq = bool(custom_config.get("use_qdq", False))
        parsed = parse({**custom_config, "use_qdq": True})
        parsed.cfg["use_qdq"] = use_qdq
        if parsed.cfg.get("device_for_scales") is None:
            parsed.cfg["device_for_scales"] = INCAcceleratorType[SCALES_OF]
        return parsed

    Fp8cfg.parse = staticmethod(parse_real_path)  # type: ignore[method-assign,assignment]


@functools.cache
def install() -> None:
    """Make INC take its Gaudi path on the CPU (once per process)."""
    _add_module_entries()
    _add_op_wrappers()
    _define_moe_measurement()
    _accept_real_path()
