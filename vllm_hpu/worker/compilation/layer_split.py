"""Graph splits between decoder layers (VLLM_CONFIG_HIDDEN_LAYERS): in lazy mode
``mark_step`` every N layers bounds the graph the compiler sees, as the
reference plugin does; elsewhere it does nothing."""

import torch
from vllm.logger import init_logger

from vllm_hpu import device

logger = init_logger("vllm.hpu.layer_split")


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The model's stack of decoder layers: its longest ``ModuleList``."""
    stacks = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return max(stacks, key=len, default=None)


def _mark_step_hook(*args: object) -> None:
    device.mark_step()


def split_graph_every(model: torch.nn.Module, num_layers: int | None) -> int:
    """Close the lazy graph every ``num_layers`` decoder layers; returns splits made."""
    layers = decoder_layers(model)
    if num_layers is None or not device.is_lazy() or layers is None:
        return 0
    split_after = list(layers)[num_layers - 1 :: num_layers]
    for layer in split_after:
        layer.register_forward_hook(_mark_step_hook)
    logger.info(
        "Lazy graphs split every %d decoder layer(s): %d split(s) per forward",
        num_layers,
        len(split_after),
    )
    return len(split_after)
