"""Intel Neural Compressor's Gaudi FP8 path on the CPU, for emulation only.

INC patches modules by class name from a per-device table, calls Gaudi's fp8 ops
through a per-device wrapper table, and refuses anything but fake quantization
(QDQ) on a CPU. Three adjustments from outside INC make it run the path it runs
on Gaudi (docs/fp8.md): the Gaudi module entries in the CPU table, torch
stand-ins for the fp8 ops, and a config parser that takes the real path with
Gaudi 3 scales. Applied once, by ``device.enable_inc`` in emulation only.

Why: INC has no CPU backend for its Gaudi path. How: table entries and one
wrapped parser, set before the first ``prepare``/``convert``. Removed by: an INC
release whose CPU accelerator takes the Gaudi path (no upstream change yet).
"""

import functools
from typing import Any

import torch

FP8 = torch.float8_e4m3fn
FP32 = torch.float32
SDPA_QUERY_CHUNK = 512  # query rows per step of the emulated fused kernel
# INC's HPU module entries that call Gaudi-only kernels even in emulation.
GAUDI_ONLY_MODULES = ("MoE", "Mixture", "GaudiFP8Linear", "BlockSoftmax")
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
    """Gaudi's fp8_fused_sdpa: q, k, v [bs, heads, len, head_size] dequantized,
    attention with probabilities through fp8 when ``q_scale_s`` is given, the
    output quantized when ``q_scale_o`` is; returns (output, amax of the
    probabilities or None). Query rows go in chunks: a long packed prompt's
    scores would not fit in memory at once."""
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
        if not any(part in name for part in GAUDI_ONLY_MODULES)
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
        }
    )


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
    _accept_real_path()
