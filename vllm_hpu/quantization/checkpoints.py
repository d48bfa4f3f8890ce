"""Which compressed-tensors schemes the plugin runs, checked at start-up in the
caller's process (the platform's config check), before any weight loads: a
scheme vLLM reads but the plugin has no kernel for is refused by name, rather
than failing at the first layer or running less quantized than asked."""

from typing import Any

RUNS = (
    "W8A8-FP8 (fp8 weights per tensor, channel or block; fp8 activations, "
    "static per tensor or dynamic), W8A8-INT8 (int8 weights per tensor or "
    "channel; symmetric int8 activations, static per tensor or dynamic per "
    "token), WNA16 (4- or 8-bit integer weights, pack-quantized, per group or "
    "channel, with or without zero points) and MXFP4-A16 (weight-only MXFP4)"
)


# Methods refused with more to say than vLLM's "... is currently not supported
# in hpu": method -> message. gpt-oss's checkpoints are "gpt_oss_mxfp4" and run
# (moe_configs.py); "mxfp4" is any other model's (vLLM's GPU-only experts) or a
# user's --quantization mxfp4 (nothing quantizes at load).
_OTHER_MXFP4 = (
    "Quantization 'mxfp4' runs on HPU only as gpt-oss's own MXFP4 checkpoints "
    "(model_type 'gpt_oss', quantization_config quant_method 'mxfp4', read "
    "without --quantization); the plugin does not quantize weights to MXFP4 "
    "at load. For another model use its bf16 checkpoint or a "
    "compressed-tensors MXFP4-A16 quantization of it (weight-only MXFP4 on "
    "dense layers and on experts without biases); for a bf16 gpt-oss "
    "checkpoint, drop --quantization."
)
REFUSED_METHODS = {"mxfp4": _OTHER_MXFP4}


def method_refusal(method: str) -> str | None:
    """The plugin's own refusal of a quantization method, or None."""
    return REFUSED_METHODS.get(method)


def check_checkpoint_quantized(model_config: Any) -> None:
    """Refuse ``gpt_oss_mxfp4`` on a checkpoint without quantization_config: the
    method reads only MXFP4 experts; bf16 ones do not fit its parameters."""
    if getattr(model_config, "quantization", None) != "gpt_oss_mxfp4":
        return
    if getattr(model_config.hf_config, "quantization_config", None) is None:
        raise ValueError(
            "--quantization gpt_oss_mxfp4 reads gpt-oss's MXFP4 checkpoints, "
            f"but {model_config.model}'s config.json has no "
            "quantization_config: its weights are not quantized, and the "
            "plugin does not quantize them at load. Drop --quantization to "
            "run it as it is, or use the model's MXFP4 checkpoint."
        )


def check_quant_config(quant_config: Any) -> None:
    """Refuse a checkpoint's quantization the plugin cannot run, naming it."""
    if quant_config is None or quant_config.get_name() != "compressed-tensors":
        return
    if quant_config.transform_config:
        raise ValueError(
            "compressed-tensors checkpoints with transforms (QuIP / SpinQuant "
            "rotations, 'transform_config') are not supported on HPU; use one "
            "quantized without them."
        )
    for target, scheme in quant_config.target_scheme_map.items():
        fmt = scheme.get("format") or quant_config.quant_format
        if scheme_name(scheme, fmt) is None:
            raise ValueError(
                f"The compressed-tensors scheme of {target!r} ({describe(scheme)}, "
                f"format {fmt!r}) is not supported on HPU. The plugin runs "
                f"{RUNS}; use a checkpoint in one of those or the unquantized model."
            )


def scheme_name(scheme: dict[str, Any], fmt: str | None) -> str | None:
    """The name of the scheme, if the plugin runs it."""
    weights, inputs = scheme.get("weights"), scheme.get("input_activations")
    if weights is None:
        return "unquantized"
    if scheme.get("output_activations") is not None or weights.dynamic:
        return None
    kind = (weights.type, weights.num_bits)
    if kind == ("float", 8):
        return _w8a8_fp8(weights, inputs)
    if kind == ("int", 8) and inputs is not None:
        return _w8a8_int8(weights, inputs)
    if weights.type == "int" and inputs is None and fmt == "pack-quantized":
        return _wna16(weights)
    if kind == ("float", 4) and inputs is None:
        return _mxfp4_a16(weights)
    return None


def _w8a8_fp8(weights: Any, inputs: Any) -> str | None:
    if inputs is None or (inputs.type, inputs.num_bits) != ("float", 8):
        return None  # fp8 weight-only (W8A16) has no HPU kernel
    if not (weights.symmetric and inputs.symmetric):
        return None
    if weights.strategy not in ("tensor", "channel", "block"):
        return None
    static_tensor = inputs.strategy == "tensor" and weights.strategy != "block"
    return "W8A8-FP8" if inputs.dynamic or static_tensor else None


def _w8a8_int8(weights: Any, inputs: Any) -> str | None:
    if (inputs.type, inputs.num_bits) != ("int", 8) or not inputs.symmetric:
        return None
    if not weights.symmetric or weights.strategy not in ("tensor", "channel"):
        return None
    dynamic_token = bool(inputs.dynamic) and inputs.strategy == "token"
    static_tensor = not inputs.dynamic and inputs.strategy == "tensor"
    return "W8A8-INT8" if dynamic_token or static_tensor else None


def _wna16(weights: Any) -> str | None:
    if weights.num_bits not in (4, 8) or weights.strategy not in ("group", "channel"):
        return None
    return "WNA16"


def _mxfp4_a16(weights: Any) -> str | None:
    mxfp4 = weights.strategy == "group" and weights.group_size == 32
    return "MXFP4-A16" if mxfp4 and weights.symmetric else None


def describe(scheme: dict[str, Any]) -> str:
    """The scheme in words ("weights int4 group 128 asymmetric, activations ...")."""
    parts = [f"weights {_describe_args(scheme.get('weights'))}"]
    parts.append(f"activations {_describe_args(scheme.get('input_activations'))}")
    if scheme.get("output_activations") is not None:
        parts.append(f"outputs {_describe_args(scheme['output_activations'])}")
    return ", ".join(parts)


def _describe_args(args: Any) -> str:
    if args is None:
        return "not quantized"
    words = [f"{args.type}{args.num_bits}"]
    if args.dynamic:
        words.append("dynamic")
    words.append(str(args.strategy))
    if args.strategy in ("group", "tensor_group"):
        words.append(str(args.group_size))
    if args.strategy == "block":
        words.append(str(args.block_structure))
    if not args.symmetric:
        words.append("asymmetric")
    return " ".join(words)
