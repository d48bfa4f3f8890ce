"""Mixture-of-experts math in plain torch: top-k routing and the routed experts.
Shapes are fixed by the bucketed token count, so one graph serves a bucket
whatever the routing; Gaudi runs its fused kernel (``device.py``) instead."""

# Why token-to-expert (experts_grouped) over dense: both static, dense does
# E / top_k times the work. benchmarks/ops.py shapes, 2 threads: float32 56 ms vs
# 104 ms dense (315 ms per-token loop), bf16 9.5 vs 18.5 ms (107 ms). Dense stays
# for sizes torch's grouped GEMM refuses.

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from vllm.model_executor.layers.fused_moe.router.cpu_router import (
    select_experts as vllm_select_experts,
)

from vllm_hpu import device
from vllm_hpu.ops.activations import SWIGLUOAI_ALPHA, SWIGLUOAI_LIMIT, gated

# torch's grouped GEMM on the CPU wants every stride a multiple of 16 bytes.
GROUPED_MM_ALIGNMENT = 16
# vLLM's EPLB kernel picks a token's replica of an expert by this hash of the
# token's index (floor(2^32 / phi), Knuth's multiplicative hash).
KNUTH_MULTIPLIER = 2654435769


@dataclass(frozen=True)
class MoeRouting:
    """How a layer picks its experts, as its model config says."""

    top_k: int
    renormalize: bool
    scoring_func: str = "softmax"
    num_expert_group: int | None = None
    topk_group: int | None = None
    routed_scaling_factor: float = 1.0
    e_score_correction_bias: torch.Tensor | None = None
    custom_routing_function: Callable | None = None


@dataclass(frozen=True)
class ExpertExtras:
    """gpt-oss's additions: per-projection biases, clamped SwiGLU gain and limit."""

    w13_bias: torch.Tensor | None = None  # [num_experts, 2 * intermediate]
    w2_bias: torch.Tensor | None = None  # [num_experts, hidden_size]
    swiglu_alpha: float = SWIGLUOAI_ALPHA
    swiglu_limit: float = SWIGLUOAI_LIMIT
    # The gated intermediate [rows, intermediate] as the down projection takes
    # it (fp8 experts round it through fp8, as Gaudi's fp8 kernel does).
    intermediate: Callable[[torch.Tensor], torch.Tensor] | None = None

    @property
    def has_bias(self) -> bool:
        return self.w13_bias is not None or self.w2_bias is not None

    def gated(self, h: torch.Tensor, activation: str) -> torch.Tensor:
        h = gated(h, activation, self.swiglu_alpha, self.swiglu_limit)
        return h if self.intermediate is None else self.intermediate(h)

    def of(self, experts: slice | torch.Tensor) -> "ExpertExtras":
        """The extras of some of the experts (their biases): a slice or ids."""
        w13, w2 = self.w13_bias, self.w2_bias
        return replace(
            self,
            w13_bias=None if w13 is None else w13[experts],
            w2_bias=None if w2 is None else w2[experts],
        )


PLAIN_EXPERTS = ExpertExtras()


def select_experts(
    hidden_states: torch.Tensor, router_logits: torch.Tensor, routing: MoeRouting
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k experts: hidden_states [num_tokens, hidden], router_logits [num_tokens,
    E] -> topk_weights [num_tokens, top_k] float32, topk_ids. vLLM's pure-torch
    routing (ungrouped: one group): softmax, or sigmoid plus selection-only bias,
    top k, renormalised and scaled as configured; no data-dependent shape."""
    grouped = routing.custom_routing_function is None
    return vllm_select_experts(
        hidden_states,
        router_logits,
        routing.top_k,
        use_grouped_topk=grouped,
        renormalize=routing.renormalize,
        topk_group=routing.topk_group or 1,
        num_expert_group=routing.num_expert_group or 1,
        custom_routing_function=routing.custom_routing_function,
        scoring_func=routing.scoring_func,
        routed_scaling_factor=routing.routed_scaling_factor,
        e_score_correction_bias=routing.e_score_correction_bias,
    )


def weights_on_input(
    hidden_states: torch.Tensor, topk_weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama 4's routing scales the expert's input, not its output; top-1 only (as
    vLLM). hidden_states [num_tokens, hidden], topk_weights [num_tokens, 1]."""
    scaled = hidden_states * topk_weights.to(hidden_states.dtype)
    return scaled, torch.ones_like(topk_weights)


def _with_bias(
    h: torch.Tensor, bias: torch.Tensor | None, experts: torch.Tensor | int
) -> torch.Tensor:
    """h: [rows, N] plus the bias [num_experts, N] (if any) of each row's expert
    (experts: [rows] ids) or of one expert for all rows."""
    return h if bias is None else h + bias[experts].to(h.dtype)


def grouped_mm_fits(
    hidden_size: int, intermediate_size: int, dtype: torch.dtype
) -> bool:
    """Whether the token-to-expert form's grouped GEMMs accept these sizes."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return all(
        size * itemsize % GROUPED_MM_ALIGNMENT == 0
        for size in (hidden_size, intermediate_size)
    )


def reads_routed_only(
    hidden_size: int, intermediate_size: int, dtype: torch.dtype
) -> bool:
    """Whether :func:`fused_experts` reads only experts with rows: ATen's CPU
    ``_grouped_mm`` fallback skips empty groups; Gaudi's kernel and dense read all."""
    cpu_grouped = device.fused_moe() is None and not device.hpu_available()
    return cpu_grouped and grouped_mm_fits(hidden_size, intermediate_size, dtype)


def experts_grouped(
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
    extras: ExpertExtras = PLAIN_EXPERTS,
) -> torch.Tensor:
    """Routed experts, token-to-expert: (token, k) rows sorted by expert, one grouped
    GEMM per projection, T * top_k rows for T tokens. hidden_states [T, hidden], w13
    [E, 2 * I, hidden], w2 [E, hidden, I], topk [T, top_k] -> [T, hidden]."""
    num_experts, top_k = w13.shape[0], topk_ids.shape[1]
    expert_ids = topk_ids.flatten().long()  # [num_tokens * top_k]
    order = expert_ids.argsort(stable=True)
    token_ids = order // top_k
    rows_per_expert = torch.zeros(
        num_experts, dtype=torch.int32, device=expert_ids.device
    ).scatter_add_(0, expert_ids, torch.ones_like(expert_ids, dtype=torch.int32))
    offsets = rows_per_expert.cumsum(0, dtype=torch.int32)  # end row of each expert
    rows = hidden_states.index_select(0, token_ids)
    row_experts = expert_ids.index_select(0, order)
    h = torch._grouped_mm(rows, w13.transpose(1, 2), offs=offsets)
    h = extras.gated(_with_bias(h, extras.w13_bias, row_experts), activation)
    out = torch._grouped_mm(h, w2.transpose(1, 2), offs=offsets)
    out = _with_bias(out, extras.w2_bias, row_experts)
    weights = topk_weights.flatten().index_select(0, order).to(out.dtype)
    return torch.zeros_like(hidden_states).index_add_(
        0, token_ids, out * weights.unsqueeze(1)
    )


def experts_dense(
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
    extras: ExpertExtras = PLAIN_EXPERTS,
) -> torch.Tensor:
    """Routed experts, dense: every expert on every token, weighted (0 if unchosen),
    E / top_k times the work, for sizes grouped GEMM refuses. Shapes as above."""
    num_tokens, num_experts = hidden_states.shape[0], w13.shape[0]
    dense_weights = torch.zeros(
        num_tokens, num_experts, dtype=hidden_states.dtype, device=hidden_states.device
    ).scatter_add_(1, topk_ids.long(), topk_weights.to(hidden_states.dtype))
    out = torch.zeros_like(hidden_states)
    for expert in range(num_experts):
        h = _with_bias(hidden_states @ w13[expert].t(), extras.w13_bias, expert)
        h = extras.gated(h, activation)
        h = _with_bias(h @ w2[expert].t(), extras.w2_bias, expert)
        out += h * dense_weights[:, expert : expert + 1]
    return out


def fused_experts(
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
    experts_min: int = 0,
    num_experts: int | None = None,
    extras: ExpertExtras = PLAIN_EXPERTS,
) -> torch.Tensor:
    """The routed experts' summed output [num_tokens, hidden]: Gaudi's fused kernel
    where it applies (plain SiLU), else token-to-expert, else dense. ``w13[e]`` is
    expert ``experts_min + e`` of the layer's ``num_experts`` (None: all); pairs
    routed elsewhere add nothing. ``extras``: biases and SwiGLU clamp."""
    kernel = device.fused_moe()
    plain = not extras.has_bias and extras.intermediate is None
    if kernel is not None and activation == "silu" and plain:
        return kernel(
            hidden_states=hidden_states,
            expert_routing_table=topk_ids.long(),
            router_weights=topk_weights.to(hidden_states.dtype),
            w12=list(w13.unbind(0)),
            w3=list(w2.unbind(0)),
            permuted_weights=True,
            activation=activation,
            experts_min=experts_min,
            experts_max=experts_min + w13.shape[0] - 1,
        )
    if num_experts is not None and num_experts != w13.shape[0]:
        topk_weights, topk_ids = _within(topk_weights, topk_ids, experts_min, w13)
    if grouped_mm_fits(w2.shape[1], w2.shape[2], hidden_states.dtype):
        return experts_grouped(
            hidden_states, w13, w2, topk_weights, topk_ids, activation, extras
        )
    return experts_dense(
        hidden_states, w13, w2, topk_weights, topk_ids, activation, extras
    )


def _within(
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    experts_min: int,
    w13: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Routing onto the experts of ``w13`` only: ids made local, and pairs routed
    elsewhere sent to its first expert with weight 0 (shapes stay static)."""
    local = topk_ids.long() - experts_min
    inside = (local >= 0) & (local < w13.shape[0])
    weights = torch.where(inside, topk_weights, torch.zeros_like(topk_weights))
    return weights, torch.where(inside, local, torch.zeros_like(local))


def routed_experts(
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    max_count: int,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """At small batch, the experts worth reading: those routed to with nonzero weight,
    padded with unrouted ones to the bucket's static ``num_tokens * top_k``.
    Returns (experts [count] local ids, routed ones ascending; topk_ids as slots of
    ``experts``), or None past ``max_count``. Weight-0 pairs go to slot 0."""
    count = topk_ids.numel()
    if count > min(max_count, num_experts - 1):
        return None
    ids = topk_ids.flatten().long()
    pairs = torch.zeros(num_experts, dtype=torch.int32, device=ids.device)
    pairs.index_add_(0, ids, (topk_weights.flatten() != 0).to(torch.int32))
    routed = (pairs > 0).to(torch.int32)  # a sort key: routed first, by id
    experts = routed.argsort(descending=True, stable=True)[:count]
    slots = torch.zeros(num_experts, dtype=torch.long, device=ids.device)
    slots.index_copy_(0, experts, torch.arange(count, device=ids.device))
    return experts, slots.index_select(0, ids).view_as(topk_ids)


def local_experts(
    topk_weights: torch.Tensor, topk_ids: torch.Tensor, expert_map: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """EP: expert_map [num_experts] is each global expert's local slot (-1 elsewhere);
    pairs routed elsewhere go to slot 0, weight 0; their owners add them."""
    local = expert_map.index_select(0, topk_ids.flatten().long()).view_as(topk_ids)
    owned = local >= 0
    weights = torch.where(owned, topk_weights, torch.zeros_like(topk_weights))
    return weights, torch.where(owned, local, torch.zeros_like(local))


def physical_experts(
    topk_ids: torch.Tensor,
    logical_to_physical: torch.Tensor,
    replica_count: torch.Tensor,
) -> torch.Tensor:
    """EPLB: each pair's logical expert becomes a physical replica by a hash of the
    token index, as vLLM's kernel. topk_ids [T, top_k]; logical_to_physical [L experts,
    max_replicas] (-1 padded); replica_count [L] -> physical ids [T, top_k]."""
    ids = topk_ids.long()
    token = torch.arange(ids.shape[0], device=ids.device).unsqueeze(1)
    hashed = (token * KNUTH_MULTIPLIER) & 0xFFFFFFFF
    replica = hashed % replica_count[ids].clamp(min=1)
    return logical_to_physical[ids, replica]


def record_expert_load(
    physical: torch.Tensor,
    expert_load: torch.Tensor,
    record: torch.Tensor,
    num_real_tokens: torch.Tensor,
) -> None:
    """Add real tokens' pairs to their physical expert's load ([num_physical], vLLM's
    EPLB counters) while ``record`` (bool scalar) is on; padding counts nothing."""
    token = torch.arange(physical.shape[0], device=physical.device).unsqueeze(1)
    counted = ((token < num_real_tokens) & record).expand_as(physical)
    expert_load.index_add_(
        0, physical.flatten().clamp(min=0), counted.flatten().to(expert_load.dtype)
    )
