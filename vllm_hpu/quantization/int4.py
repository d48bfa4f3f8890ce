"""What the AWQ and GPTQ configs share: their 4-bit packing and the checkpoint
variants they refuse (the dequantization itself is in ``dequant.py``)."""

from vllm_hpu.quantization.dequant import pack_factor

PACK_FACTOR = pack_factor(4)  # 4-bit values in one int32


def check_bits(method: str, bits: int) -> None:
    if bits != 4:
        raise ValueError(
            f"{method} checkpoints with {bits}-bit weights are not supported on HPU: "
            "only 4-bit AWQ and GPTQ are. Use a 4-bit checkpoint or the bf16 model."
        )
