"""Unpacking and dequantizing the 4-bit weights of AWQ and GPTQ checkpoints:
eight 4-bit values in each int32, unpacked in plain torch inside the forward."""

import torch

PACK_FACTOR = 8  # 4-bit values in one int32
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)
# AutoAWQ stores logical value order_map[i] = [0, 2, 4, 6, 1, 3, 5, 7][i] in nibble i;
# logical value j therefore sits in nibble AWQ_NIBBLE_OF[j].
AWQ_NIBBLE_OF = (0, 4, 1, 5, 2, 6, 3, 7)


def unpack_int4(
    packed: torch.Tensor, dim: int, awq_order: bool = False
) -> torch.Tensor:
    """The 4-bit values of an int32 tensor, eight per element along ``dim``
    (which grows eightfold), as int32 in 0..15; ``awq_order`` undoes AutoAWQ's
    interleaved nibble order, else nibble i holds the i-th value (GPTQ)."""
    shifts = _SHIFTS.to(packed.device)
    if awq_order:
        shifts = shifts[list(AWQ_NIBBLE_OF)]
    moved = packed.movedim(dim, -1)
    values = (moved.unsqueeze(-1) >> shifts) & 0xF
    return values.flatten(-2).movedim(-1, dim)


def dequantize(
    values: torch.Tensor,
    zeros: torch.Tensor,
    scales: torch.Tensor,
    groups: torch.Tensor,
) -> torch.Tensor:
    """The (in, out) weight from 4-bit ``values`` (in, out), per-group ``zeros``
    and ``scales`` (groups, out), and ``groups``: each input row's group index."""
    centred = (values - zeros[groups]).to(scales.dtype)
    return centred * scales[groups]


def contiguous_groups(rows: int, group_size: int, device: torch.device) -> torch.Tensor:
    """Each input row's group when groups are consecutive runs of ``group_size``
    rows (-1: one group for all rows)."""
    size = rows if group_size == -1 else group_size
    return torch.arange(rows, device=device, dtype=torch.int32) // size


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
