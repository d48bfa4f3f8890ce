"""Per-rank evidence for the expert-parallel tests (issue 53): which experts
each rank holds, read from its MoE layers (``collective_rpc``), and how many
(token, expert) pairs each rank's experts took, from the engine's own
routing: the expert ids the engine returns per token and layer
(``enable_return_routed_experts``), or with EPLB its load counters."""

from typing import Any

import numpy as np
import torch

from vllm_hpu.worker.capabilities.eplb import HpuEplb


def experts_held(worker: Any) -> dict[int, list[int]]:
    """Per MoE layer (by decoder layer index), the logical experts of this
    rank's local slots, in slot order (with EPLB, through its current
    physical-to-logical map)."""
    from vllm.model_executor.layers.fused_moe import RoutedExperts
    from vllm.model_executor.models.utils import extract_layer_index

    model = worker.model_runner.model
    layers = [m for m in model.modules() if isinstance(m, RoutedExperts)]
    eplb = worker.model_runner.caps.eplb
    physical_to_logical = None
    if isinstance(eplb, HpuEplb):
        (model_state,) = eplb.controller.state.model_states.values()
        physical_to_logical = model_state.physical_to_logical_map.tolist()
    held = {}
    for index, layer in enumerate(layers):
        physical = list(range(layer.local_num_experts))  # all, without EP
        if layer.expert_map is not None:
            expert_map = layer.expert_map.tolist()
            slots = sorted(
                (local, p) for p, local in enumerate(expert_map) if local >= 0
            )
            physical = [p for _, p in slots]
        if physical_to_logical is not None:
            physical = [physical_to_logical[index][p] for p in physical]
        held[extract_layer_index(layer.layer_name)] = physical
    return held


def eplb_rank_load(worker: Any) -> int:
    """(token, expert) pairs EPLB counted for this rank's experts over its
    load window, all MoE layers (its physical slots of the global count)."""
    from vllm.distributed import get_ep_group

    eplb = worker.model_runner.caps.eplb
    assert isinstance(eplb, HpuEplb), "the engine runs without --enable-eplb"
    (model_state,) = eplb.controller.state.model_states.values()
    window = model_state.expert_load_window.sum(dim=0)  # [layers, physical]
    group = get_ep_group()
    per_rank = window.shape[1] // group.world_size
    start = group.rank_in_group * per_rank
    return int(window[:, start : start + per_rank].sum())


def greedy_routed(
    llm: Any, prompts: list[list[int]], max_tokens: list[int] | int
) -> tuple[list[list[int]], list[np.ndarray]]:
    """Greedy tokens and each request's routed experts [tokens, layers, k]
    (the engine runs with enable_return_routed_experts)."""
    from vllm import SamplingParams

    counts = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    params = [
        SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in counts
    ]
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False
    )
    completions = [output.outputs[0] for output in outputs]
    return [list(c.token_ids) for c in completions], [
        c.routed_experts for c in completions
    ]


def pairs_per_rank(
    routed: list[np.ndarray], held: list[dict[int, list[int]]]
) -> list[int]:
    """Of the routed experts ([tokens, layers, top_k] per request), the
    (token, expert) pairs each rank's experts take, over the MoE layers
    (``held``: per rank, per MoE layer index, its experts)."""
    counts = []
    for rank_held in held:
        count = 0
        for layer, experts in rank_held.items():
            mine = np.array(sorted(set(experts)))
            count += sum(int(np.isin(ids[:, layer], mine).sum()) for ids in routed)
        counts.append(count)
    return counts


def transformers_routing(model_dir: str, tokens: list[int]) -> dict[int, np.ndarray]:
    """Per MoE layer index, the experts transformers' router picks for each of
    ``tokens`` [len(tokens), top_k] (the routed experts modules' input)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    chosen: dict[int, np.ndarray] = {}

    def record(layer: int):  # type: ignore[no-untyped-def]
        def hook(_module, args):  # type: ignore[no-untyped-def]
            chosen[layer] = args[1].numpy()

        return hook

    for index, layer in enumerate(model.model.layers):
        experts = getattr(layer.mlp, "experts", None)
        if experts is not None:
            experts.register_forward_pre_hook(record(index))
    with torch.no_grad():
        model(torch.tensor([tokens]))
    return chosen


def assert_same_experts(routed: np.ndarray, expected: dict[int, np.ndarray]) -> None:
    """The engine's routed experts [tokens, layers, k] are transformers' in
    every MoE layer (each token's set: the order within top-k may differ)."""
    for layer, want in expected.items():
        got = np.sort(routed[:, layer].astype(np.int64), axis=-1)
        np.testing.assert_array_equal(got, np.sort(want, axis=-1), f"layer {layer}")
