"""MoE routing and experts (ops/moe.py) vs a naive loop over tokens and experts."""

import pytest
import torch
import torch.nn.functional as F

from vllm_hpu.ops.moe import (
    ExpertExtras,
    MoeRouting,
    experts_dense,
    experts_grouped,
    fused_experts,
    grouped_mm_fits,
    local_experts,
    physical_experts,
    record_expert_load,
    routed_experts,
    select_experts,
    weights_on_input,
)

NUM_TOKENS, HIDDEN_SIZE, INTERMEDIATE_SIZE, NUM_EXPERTS, TOP_K = 7, 64, 32, 8, 2
TOLERANCE = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.bfloat16: {"atol": 3e-2, "rtol": 3e-2},
}
ROUTINGS = {
    "softmax": {},
    "sigmoid-bias": {"scoring_func": "sigmoid", "bias": True},
    "grouped-softmax": {"num_expert_group": 4, "topk_group": 2},
    "grouped-sigmoid-bias-scaled": {
        "scoring_func": "sigmoid",
        "bias": True,
        "num_expert_group": 4,
        "topk_group": 2,
        "routed_scaling_factor": 2.5,
    },
}


def make_routing(name: str, renormalize: bool) -> MoeRouting:
    args = dict(ROUTINGS[name])
    bias = torch.randn(NUM_EXPERTS) * 0.5 if args.pop("bias", False) else None
    return MoeRouting(TOP_K, renormalize, e_score_correction_bias=bias, **args)


def naive_route(logits: torch.Tensor, routing: MoeRouting) -> dict[int, float]:
    """One token: {expert: weight}, group by group, expert by expert."""
    logits = logits.float()
    scores = (
        logits.softmax(-1) if routing.scoring_func == "softmax" else logits.sigmoid()
    )
    bias = routing.e_score_correction_bias
    choice = scores + bias if bias is not None else scores
    num_groups = routing.num_expert_group or 1
    size = NUM_EXPERTS // num_groups
    groups = [choice[g * size : (g + 1) * size] for g in range(num_groups)]
    group_scores = [
        float(g.topk(2).values.sum()) if bias is not None else float(g.max())
        for g in groups
    ]
    kept = sorted(range(num_groups), key=lambda g: -group_scores[g])
    kept = kept[: routing.topk_group or 1]
    candidates = [e for e in range(NUM_EXPERTS) if e // size in kept]
    chosen = sorted(candidates, key=lambda e: -float(choice[e]))[:TOP_K]
    weights = {e: float(scores[e]) for e in chosen}
    total = sum(weights.values()) if routing.renormalize else 1.0
    return {e: w / total * routing.routed_scaling_factor for e, w in weights.items()}


NAIVE_ACTIVATIONS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def naive_moe(x, w13, w2, routes, activation: str = "silu") -> torch.Tensor:
    """Per token, per chosen expert: act(gate) * up, down, weighted sum."""
    act = NAIVE_ACTIVATIONS[activation]
    out = torch.zeros(x.shape, dtype=torch.float32)
    for t, route in enumerate(routes):
        for expert, weight in route.items():
            gate, up = (x[t].float() @ w13[expert].float().t()).chunk(2)
            out[t] += weight * ((act(gate) * up) @ w2[expert].float().t())
    return out


def random_weights(dtype: torch.dtype, hidden_size: int = HIDDEN_SIZE):
    torch.manual_seed(0)
    x = torch.randn(NUM_TOKENS, hidden_size).to(dtype)
    w13 = (torch.randn(NUM_EXPERTS, 2 * INTERMEDIATE_SIZE, hidden_size) * 0.2).to(dtype)
    w2 = (torch.randn(NUM_EXPERTS, hidden_size, INTERMEDIATE_SIZE) * 0.2).to(dtype)
    return x, w13, w2


def as_routes(weights: torch.Tensor, ids: torch.Tensor) -> list[dict[int, float]]:
    return [
        {int(e): float(w) for e, w in zip(ids_row, weights_row, strict=True)}
        for ids_row, weights_row in zip(ids, weights, strict=True)
    ]


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("name", sorted(ROUTINGS))
def test_select_experts_matches_naive_routing(name, renormalize):
    torch.manual_seed(1)
    routing = make_routing(name, renormalize)
    logits = torch.randn(NUM_TOKENS, NUM_EXPERTS)
    x = torch.randn(NUM_TOKENS, HIDDEN_SIZE)
    weights, ids = select_experts(x, logits, routing)
    assert weights.shape == ids.shape == (NUM_TOKENS, TOP_K)
    for got, row in zip(as_routes(weights, ids), logits, strict=True):
        want = naive_route(row, routing)
        assert sorted(got) == sorted(want)
        torch.testing.assert_close(
            torch.tensor([got[e] for e in sorted(got)]),
            torch.tensor([want[e] for e in sorted(want)]),
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("name", ["softmax", "grouped-sigmoid-bias-scaled"])
def test_fused_experts_matches_naive_loop(name, renormalize, dtype):
    x, w13, w2 = random_weights(dtype)
    routing = make_routing(name, renormalize)
    logits = torch.randn(NUM_TOKENS, NUM_EXPERTS)
    weights, ids = select_experts(x, logits, routing)
    out = fused_experts(x, w13, w2, weights, ids)
    assert out.dtype == dtype and out.shape == x.shape
    expected = naive_moe(x, w13, w2, [naive_route(row, routing) for row in logits])
    torch.testing.assert_close(out.float(), expected, **TOLERANCE[dtype])


@pytest.mark.parametrize("activation", sorted(NAIVE_ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("form", [experts_grouped, experts_dense])
def test_expert_forms_agree_with_naive_loop(form, dtype, activation):
    """Both forms, even when an expert gets no token or every token."""
    x, w13, w2 = random_weights(dtype)
    ids = torch.tensor([[3, 0]] * (NUM_TOKENS - 1) + [[5, 3]])
    weights = torch.rand(NUM_TOKENS, TOP_K)
    out = form(x, w13, w2, weights, ids, activation)
    expected = naive_moe(x, w13, w2, as_routes(weights, ids), activation)
    torch.testing.assert_close(out.float(), expected, **TOLERANCE[dtype])


def test_fused_experts_falls_back_to_dense_for_unaligned_sizes():
    hidden_size = 6  # 24 bytes of float32: the grouped GEMM refuses the stride
    assert not grouped_mm_fits(hidden_size, INTERMEDIATE_SIZE, torch.float32)
    x, w13, w2 = random_weights(torch.float32, hidden_size)
    weights, ids = torch.rand(NUM_TOKENS, TOP_K), torch.randint(0, 8, (NUM_TOKENS, 1))
    ids = torch.cat([ids, (ids + 1) % NUM_EXPERTS], dim=1)
    out = fused_experts(x, w13, w2, weights, ids)
    torch.testing.assert_close(out, naive_moe(x, w13, w2, as_routes(weights, ids)))


def naive_gpt_oss_moe(x, w13, w2, routes, extras: ExpertExtras) -> torch.Tensor:
    """gpt-oss's experts as transformers writes them: biased projections, gate and
    up interleaved, both clamped, (up + 1) * gate * sigmoid(alpha * gate)."""
    alpha, limit = extras.swiglu_alpha, extras.swiglu_limit
    out = torch.zeros(x.shape, dtype=torch.float32)
    for t, route in enumerate(routes):
        for expert, weight in route.items():
            h = x[t].float() @ w13[expert].float().t() + extras.w13_bias[expert].float()
            gate, up = h[::2].clamp(max=limit), h[1::2].clamp(-limit, limit)
            glu = (up + 1) * gate * torch.sigmoid(alpha * gate)
            down = glu @ w2[expert].float().t() + extras.w2_bias[expert].float()
            out[t] += weight * down
    return out


def gpt_oss_case(dtype: torch.dtype):
    """Weights large enough that the clamp binds on a good share of the rows."""
    x, w13, w2 = random_weights(dtype)
    w13 = (w13.float() * 20).to(dtype)
    extras = ExpertExtras(
        w13_bias=torch.randn(NUM_EXPERTS, 2 * INTERMEDIATE_SIZE).to(dtype),
        w2_bias=torch.randn(NUM_EXPERTS, HIDDEN_SIZE).to(dtype),
        swiglu_alpha=1.5,
        swiglu_limit=5.0,
    )
    return x, w13, w2, extras


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("form", [experts_grouped, experts_dense, fused_experts])
def test_gpt_oss_experts_match_naive_loop(form, dtype):
    x, w13, w2, extras = gpt_oss_case(dtype)
    h = torch.einsum("th,eih->tei", x.float(), w13.float())
    assert (h.abs() > extras.swiglu_limit).float().mean() > 0.2  # the clamp binds
    ids = torch.tensor([[3, 0]] * (NUM_TOKENS - 1) + [[5, 3]])
    weights = torch.rand(NUM_TOKENS, TOP_K)
    out = form(x, w13, w2, weights, ids, "swigluoai", extras=extras)
    expected = naive_gpt_oss_moe(x, w13, w2, as_routes(weights, ids), extras)
    # Outputs reach a few hundred: bf16 rounds them at about 1 unit.
    scale = expected.abs().max()
    torch.testing.assert_close(
        out.float() / scale, expected / scale, **TOLERANCE[dtype]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_routing_weights_on_the_input_scale_what_the_expert_sees(dtype):
    """Llama 4: expert(weight * x), not weight * expert(x); top-1."""
    x, w13, w2 = random_weights(dtype)
    ids = torch.randint(0, NUM_EXPERTS, (NUM_TOKENS, 1))
    weights = torch.rand(NUM_TOKENS, 1) + 0.5
    scaled, unit = weights_on_input(x, weights)
    out = fused_experts(scaled, w13, w2, unit, ids)
    expected = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(NUM_TOKENS):
        expert = int(ids[t, 0])
        gate, up = (weights[t, 0] * x[t].float() @ w13[expert].float().t()).chunk(2)
        expected[t] = (F.silu(gate) * up) @ w2[expert].float().t()
    torch.testing.assert_close(out.float(), expected, **TOLERANCE[dtype])
    on_output = fused_experts(x, w13, w2, weights, ids)
    assert not torch.allclose(on_output.float(), expected, **TOLERANCE[dtype])


@pytest.mark.parametrize("placement", ["linear", "round_robin"])
def test_expert_parallel_ranks_sum_to_all_experts(placement):
    """Two expert-parallel ranks, each with half of the experts and the global
    routing made local (local_experts), add up to the experts on one rank; each
    rank's own share is nonzero and differs from the whole."""
    x, w13, w2 = random_weights(torch.float32)
    logits = torch.randn(NUM_TOKENS, NUM_EXPERTS)
    weights, ids = select_experts(x, logits, MoeRouting(TOP_K, renormalize=True))
    owners = {
        "linear": torch.arange(NUM_EXPERTS) // (NUM_EXPERTS // 2),
        "round_robin": torch.arange(NUM_EXPERTS) % 2,
    }[placement]
    parts = []
    for rank in range(2):
        mine = (owners == rank).nonzero().flatten()
        expert_map = torch.full((NUM_EXPERTS,), -1, dtype=torch.int32)
        expert_map[mine] = torch.arange(len(mine), dtype=torch.int32)
        local_weights, local_ids = local_experts(weights, ids, expert_map)
        parts.append(fused_experts(x, w13[mine], w2[mine], local_weights, local_ids))
    whole = fused_experts(x, w13, w2, weights, ids)
    torch.testing.assert_close(parts[0] + parts[1], whole, **TOLERANCE[torch.float32])
    for part in parts:
        assert part.abs().sum() > 0 and not torch.allclose(part, whole)


@pytest.mark.parametrize("num_tokens", [1, 3])
def test_small_batches_read_the_routed_experts_only(num_tokens):
    """Fewer (token, k) pairs than experts: the experts gathered are the routed
    ones first (by id), padded to num_tokens * top_k with unrouted ones, and
    the gathered experts with the pairs made slots give the full output."""
    x, w13, w2 = random_weights(torch.float32)
    x = x[:num_tokens]
    weights = torch.rand(num_tokens, TOP_K) + 0.1
    ids = torch.tensor([[5, 2], [2, 7], [5, 7]])[:num_tokens]
    experts, slots = routed_experts(weights, ids, NUM_EXPERTS, NUM_EXPERTS)
    routed = sorted(set(ids.flatten().tolist()))
    assert experts.tolist()[: len(routed)] == routed
    assert len(experts) == num_tokens * TOP_K and len(set(experts.tolist())) == len(
        experts
    )
    torch.testing.assert_close(experts[slots], ids)
    out = fused_experts(x, w13[experts], w2[experts], weights, slots)
    torch.testing.assert_close(out, fused_experts(x, w13, w2, weights, ids))


def test_pairs_of_weight_zero_read_no_expert():
    """Pairs routed to another expert-parallel rank weigh 0 on this one: their
    expert is not gathered for them, and they add nothing."""
    x, w13, w2 = random_weights(torch.float32)
    weights, ids = torch.tensor([[0.7, 0.0]]), torch.tensor([[3, 6]])
    experts, slots = routed_experts(weights, ids, NUM_EXPERTS, NUM_EXPERTS)
    assert experts.tolist() == [3, 0] and slots.tolist() == [[0, 0]]
    out = fused_experts(x[:1], w13[experts], w2[experts], weights, slots)
    torch.testing.assert_close(out, fused_experts(x[:1], w13, w2, weights, ids))
    every = torch.zeros(4, 2, dtype=torch.long)  # as many pairs as experts
    assert routed_experts(weights, every, NUM_EXPERTS, NUM_EXPERTS) is None
    assert routed_experts(weights, ids, NUM_EXPERTS, max_count=1) is None


def test_eplb_maps_logical_experts_to_replicas_and_counts_real_tokens():
    """EPLB: logical expert 1 has replicas at physical 1 and 4; a token's hash
    (vLLM's Knuth multiplier) picks one, and only the first num_real_tokens
    tokens' pairs count into the physical experts' load, when recording."""
    logical_to_physical = torch.tensor([[0, -1], [1, 4], [2, -1], [3, -1]])
    replicas = torch.tensor([1, 2, 1, 1])
    ids = torch.tensor([[1, 0], [1, 2], [1, 3], [1, 0]])
    physical = physical_experts(ids, logical_to_physical, replicas)
    picked = [(t * 2654435769 & 0xFFFFFFFF) % 2 for t in range(4)]
    assert physical[:, 0].tolist() == [[1, 4][p] for p in picked]
    assert physical[:, 1].tolist() == [0, 2, 3, 0]
    load = torch.zeros(5, dtype=torch.int32)
    record_expert_load(physical, load, torch.tensor(True), torch.tensor(3))
    want = torch.zeros(5, dtype=torch.int32)
    for expert in physical[:3].flatten().tolist():
        want[expert] += 1
    assert load.tolist() == want.tolist()
    record_expert_load(physical, load, torch.tensor(False), torch.tensor(3))
    assert load.tolist() == want.tolist()  # not recording: unchanged
