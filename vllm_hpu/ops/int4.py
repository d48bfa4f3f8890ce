"""What the AWQ and GPTQ configs share: their 4-bit packing and the checkpoint
variants they refuse (the dequantization itself is in ``dequant.py``)."""

import torch

from vllm_hpu.ops.dequant import pack_factor

PACK_FACTOR = pack_factor(4)  # 4-bit values in one int32


def check_bits(method: str, bits: int) -> None:
    if bits != 4:
        raise ValueError(
            f"{method} checkpoints with {bits}-bit weights are not supported on HPU: "
            "only 4-bit AWQ and GPTQ are. Use a 4-bit checkpoint or the bf16 model."
        )


def refuse_experts(method: str, layer: torch.nn.Module) -> None:
    """Quantized mixture-of-experts layers have no HPU method yet: refused while
    the model is built, before any weight loads."""
    from vllm.model_executor.layers.fused_moe import RoutedExperts

    if isinstance(layer, RoutedExperts):
        raise ValueError(
            f"{method} mixture-of-experts layers are not supported on HPU yet; "
            "use the unquantized (bf16) model."
        )
