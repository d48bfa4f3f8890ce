"""Mamba2 state-space ops in plain torch, on padded ``[B, Q]`` rows with state slots.

The Mamba2 layer (vLLM's ``MambaMixer2``) calls a causal depthwise convolution and
a selective scan; vLLM runs both as Triton kernels over varlen batches. These are
their static-shape equivalents for the HPU passes:

- a prompt pass has ``B`` rows of ``Q`` tokens; row ``i`` holds ``query_lens[i]``
  real tokens then padding. Padding is neutralised by masks, never by a Python
  branch on tensor values: its ``dt`` is 0 (decay 1, no input), so the state after
  ``Q`` tokens equals the state after ``query_lens[i]``, and the conv state is
  gathered at the row's own length.
- a decode pass has ``B`` rows of one token.

States live in per-layer tensors indexed by slot, in vLLM's layouts: conv state
``[num_slots, K - 1, conv_dim]`` ("SD") and SSM state ``[num_slots, num_heads,
head_dim, d_state]``. ``state_slots[i]`` names row ``i``'s slot (padding rows
share a dummy slot, which takes their writes); ``has_initial_state[i]`` is False
for a request's first tokens, whose slot may hold a previous owner's state, which
is then read as zeros. Scans run in float32 at least (float64 stays float64).
"""

import torch
import torch.nn.functional as F


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half types, the dtype itself for float32/float64."""
    return torch.promote_types(dtype, torch.float32)


def gather_initial_states(
    states: torch.Tensor, state_slots: torch.Tensor, has_initial_state: torch.Tensor
) -> torch.Tensor:
    """``states[state_slots]``, with zeros for rows that have no initial state.

    ``torch.where`` (not a multiply), so a stale slot holding NaN cannot leak in.
    """
    picked = states.index_select(0, state_slots)
    keep = has_initial_state.view(-1, *([1] * (picked.dim() - 1)))
    return torch.where(keep, picked, torch.zeros_like(picked))


def valid_token_mask(query_lens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """``[B, Q]`` bool: True at a row's real tokens, False at its padding."""
    positions = torch.arange(num_tokens, device=query_lens.device)
    return positions[None, :] < query_lens[:, None]


def _activate(x: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation is None:
        return x
    if activation in ("silu", "swish"):
        return F.silu(x)
    raise ValueError(f"conv activation {activation!r} is not supported (silu or none)")


def causal_conv1d_prompt(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    query_lens: torch.Tensor,
    activation: str | None = "silu",
) -> torch.Tensor:
    """Causal depthwise conv over ``x [B, Q, C]``, continuing each row's conv state.

    ``weight`` is ``[C, K]`` (vLLM's ``conv_weights``). Each row is prefixed with its
    ``K - 1`` previous inputs from ``conv_state [slots, K - 1, C]`` (zeros without an
    initial state); the slot then receives the ``K - 1`` inputs ending at the row's
    last real token (positions ``len .. len + K - 2`` of ``cat(state, x)``), which
    include old state entries when ``len < K - 1``. Returns ``[B, Q, C]`` in x's dtype;
    outputs at padding positions are meaningless. With speculative decoding
    vLLM's conv state has a row per draft more: the first ``K - 1`` are used.
    """
    width = weight.shape[1]
    conv_state = conv_state[:, : width - 1]
    history = gather_initial_states(conv_state, state_slots, has_initial_state)
    full = torch.cat([history.to(weight.dtype), x.to(weight.dtype)], dim=1)
    out = F.conv1d(full.transpose(1, 2), weight.unsqueeze(1), bias, groups=x.shape[2])
    out = _activate(out.transpose(1, 2), activation)
    offsets = torch.arange(width - 1, device=x.device)
    positions = query_lens[:, None] + offsets[None, :]
    new_state = full.gather(1, positions[:, :, None].expand(-1, -1, x.shape[2]))
    conv_state.index_copy_(0, state_slots, new_state.to(conv_state.dtype))
    return out.to(x.dtype)


def causal_conv1d_decode(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    activation: str | None = "silu",
) -> torch.Tensor:
    """One conv step for ``x [B, C]``: the prompt conv with one token per row."""
    one = torch.ones_like(state_slots)
    out = causal_conv1d_prompt(
        x[:, None],
        conv_state,
        weight,
        bias,
        state_slots,
        has_initial_state,
        one,
        activation,
    )
    return out[:, 0]


def _repeat_groups(t: torch.Tensor, num_heads: int, dim: int) -> torch.Tensor:
    """``[.., G, N] -> [.., num_heads, N]``: head ``h`` reads group ``h // (H / G)``."""
    return t.repeat_interleave(num_heads // t.shape[dim], dim=dim)


def _discretize_dt(dt: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """Mamba2's step size: ``softplus(dt + dt_bias)``."""
    return F.softplus(dt + dt_bias.to(dt.dtype))


def _to_chunks(t: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``[B, L, ...] -> [B, L / chunk_size, chunk_size, ...]`` (L a multiple)."""
    return t.reshape(t.shape[0], -1, chunk_size, *t.shape[2:])


def _ssd_chunks(
    xdt: torch.Tensor,
    log_decay: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    initial: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked SSD scan on chunked inputs; returns ``(y, final_state)``.

    Shapes: ``xdt [B, n, l, H, P]`` (x * dt), ``log_decay [B, n, l, H]`` (dt * A),
    ``b``/``c [B, n, l, H, N]``, ``initial [B, H, P, N]``. Inside a chunk the output is
    an attention-like product with decays ``exp(cum_i - cum_j)`` (j <= i); across
    chunks one state per chunk boundary is carried by a loop over the (static)
    chunk count, so each step is a few batched matmuls.
    """
    cum = log_decay.cumsum(dim=2)
    size = cum.shape[2]
    upper = torch.ones(size, size, dtype=torch.bool, device=cum.device).triu(1)
    pair = (cum[:, :, :, None] - cum[:, :, None, :]).masked_fill(
        upper[..., None], -torch.inf
    )
    scores = torch.einsum("bnlhs,bnmhs->bnlmh", c, b) * pair.exp()
    y = torch.einsum("bnlmh,bnmhp->bnlhp", scores, xdt)
    to_end = (cum[:, :, -1:] - cum).exp()
    chunk_states = torch.einsum("bnlhs,bnlh,bnlhp->bnhps", b, to_end, xdt)
    chunk_decay = cum[:, :, -1].exp()
    state = initial
    starts = []
    for n in range(cum.shape[1]):
        starts.append(state)
        state = state * chunk_decay[:, n, :, None, None] + chunk_states[:, n]
    start_states = torch.stack(starts, dim=1)
    y_prev = torch.einsum("bnlhs,bnhps->bnlhp", c, start_states)
    return y + y_prev * cum.exp()[..., None], state


def mamba_chunk_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_state: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    query_lens: torch.Tensor,
    chunk_size: int,
) -> torch.Tensor:
    """Mamba2's selective scan over padded prompt rows; writes the final states.

    ``x [B, Q, H, P]``, raw ``dt [B, Q, H]`` (softplus(dt + dt_bias) is applied
    here), ``A [H]`` (already ``-exp(A_log)``), ``B``/``C [B, Q, G, N]``,
    ``D``/``dt_bias [H]``,
    ``ssm_state [slots, H, P, N]``. Padding tokens get ``dt = 0``; ``Q`` is padded to
    a multiple of ``chunk_size`` the same way. The result does not depend on
    ``chunk_size`` beyond rounding; ``[B, H, Q/cs, cs, cs]``-sized intermediates
    make it the memory knob. Returns ``y [B, Q, H, P]`` (before the gated norm).
    """
    batch, num_tokens, num_heads, _ = x.shape
    dtype = compute_dtype(x.dtype)
    step = _discretize_dt(dt.to(dtype), dt_bias)
    step = step * valid_token_mask(query_lens, num_tokens)[..., None]
    pad = (-num_tokens) % chunk_size
    xdt = F.pad(x.to(dtype) * step[..., None], (0, 0, 0, 0, 0, pad))
    log_decay = F.pad(step * A.to(dtype), (0, 0, 0, pad))
    b, c = (
        F.pad(_repeat_groups(t.to(dtype), num_heads, 2), (0, 0, 0, 0, 0, pad))
        for t in (B, C)
    )
    initial = gather_initial_states(ssm_state, state_slots, has_initial_state)
    y, final = _ssd_chunks(
        _to_chunks(xdt, chunk_size),
        _to_chunks(log_decay, chunk_size),
        _to_chunks(b, chunk_size),
        _to_chunks(c, chunk_size),
        initial.to(dtype),
    )
    y = y.reshape(batch, -1, *y.shape[3:])[:, :num_tokens]
    ssm_state.index_copy_(0, state_slots, final.to(ssm_state.dtype))
    return (y + x.to(dtype) * D.to(dtype)[:, None]).to(x.dtype)


def mamba_state_step(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_state: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
) -> torch.Tensor:
    """One recurrent Mamba2 step for decode rows; writes the new states.

    ``x [B, H, P]``, raw ``dt [B, H]``, ``B``/``C [B, G, N]``, others as in
    ``mamba_chunk_scan``. ``state <- exp(dt * A) * state + dt * x (x) B``, then
    ``y = state . C + D * x``. Returns ``[B, H, P]``.
    """
    num_heads = x.shape[1]
    dtype = compute_dtype(x.dtype)
    step = _discretize_dt(dt.to(dtype), dt_bias)
    b, c = (_repeat_groups(t.to(dtype), num_heads, 1) for t in (B, C))
    state = gather_initial_states(ssm_state, state_slots, has_initial_state).to(dtype)
    decay = (step * A.to(dtype)).exp()[:, :, None, None]
    xdt = x.to(dtype) * step[..., None]
    state = state * decay + xdt[..., None] * b[:, :, None, :]
    ssm_state.index_copy_(0, state_slots, state.to(ssm_state.dtype))
    y = torch.einsum("bhps,bhs->bhp", state, c) + x.to(dtype) * D.to(dtype)[:, None]
    return y.to(x.dtype)
