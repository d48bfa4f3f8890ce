"""Per-rank evidence for the expert-parallel tests (issue 53): which experts
each rank holds, read from its MoE layers (``collective_rpc``), and how many
(token, expert) pairs each rank's experts took, from the engine's own
routing: the expert ids the engine returns per token and layer
(``enable_return_routed_experts``), or with EPLB its load counters."""

from typing import Any

import numpy as np


def experts_held(worker: Any) -> list[list[int]]:
    """Per MoE layer, the logical experts of this rank's local slots, in slot
    order (with EPLB, through its current physical-to-logical map)."""
    from vllm.model_executor.layers.fused_moe import RoutedExperts

    model = worker.model_runner.model
    layers = [m for m in model.modules() if isinstance(m, RoutedExperts)]
    eplb = worker.model_runner.caps.eplb
    physical_to_logical = None
    if eplb is not None:
        (model_state,) = eplb.controller.state.model_states.values()
        physical_to_logical = model_state.physical_to_logical_map.tolist()
    held = []
    for index, layer in enumerate(layers):
        expert_map = layer.expert_map.tolist()
        slots = sorted(
            (local, physical) for physical, local in enumerate(expert_map) if local >= 0
        )
        physical = [p for _, p in slots]
        if physical_to_logical is not None:
            physical = [physical_to_logical[index][p] for p in physical]
        held.append(physical)
    return held


def eplb_rank_load(worker: Any) -> int:
    """(token, expert) pairs EPLB counted for this rank's experts over its
    load window, all MoE layers (its physical slots of the global count)."""
    from vllm.distributed import get_ep_group

    eplb = worker.model_runner.caps.eplb
    (model_state,) = eplb.controller.state.model_states.values()
    window = model_state.expert_load_window.sum(dim=0)  # [layers, physical]
    group = get_ep_group()
    per_rank = window.shape[1] // group.world_size
    start = group.rank_in_group * per_rank
    return int(window[:, start : start + per_rank].sum())


def pairs_per_rank(
    routed: list[np.ndarray], held: list[list[list[int]]], moe_layers: list[int]
) -> list[int]:
    """Of the returned routed experts ([tokens, layers, top_k] per request),
    the pairs whose expert each rank holds, over the MoE layers (``held``:
    per rank, per MoE layer, its experts)."""
    counts = []
    for rank_held in held:
        count = 0
        for index, layer in enumerate(moe_layers):
            experts = np.array(rank_held[index])
            count += sum(int(np.isin(ids[:, layer], experts).sum()) for ids in routed)
        counts.append(count)
    return counts
