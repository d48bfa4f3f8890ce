"""Gated delta-net (GDN) ops in plain torch, on padded ``[B, Q]`` rows with state slots.

Qwen3-Next's linear-attention layers (vLLM runs them as FLA Triton kernels).
Per token and value head, with ``S [dv, dk]`` (vLLM's state layout):

    S <- exp(g) * S;  S <- S + beta * (v - S k) k^T;  o = S q

``q``, ``k`` L2-normalised, ``q`` scaled by ``1/sqrt(dk)``. Padding gets ``g =
0`` and ``beta = 0`` (no decay, no write). Math runs in float32 at least."""

import torch
import torch.nn.functional as F

from vllm_hpu.ops.mamba import compute_dtype, gather_initial_states, valid_token_mask


def gdn_gating(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(g, beta)`` from the ``a``/``b`` projections ``[..., v_heads]``, in float32+:
    the log decay (<= 0) and the write strength."""
    dtype = compute_dtype(a.dtype)
    g = -A_log.to(dtype).exp() * F.softplus(a.to(dtype) + dt_bias.to(dtype))
    return g, torch.sigmoid(b.to(dtype))


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim (FLA's and transformers' form)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def normalize_qk(
    query: torch.Tensor, key: torch.Tensor, num_v_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """L2-normalise ``query``/``key [..., k_heads, dk]``, scale ``query`` by 1/sqrt(dk),
    repeat both to ``[..., v_heads, dk]`` (head h reads h // (v/k)), float32+."""
    dtype = compute_dtype(query.dtype)
    repeats = num_v_heads // key.shape[-2]
    q = l2norm(query.to(dtype)) * query.shape[-1] ** -0.5
    k = l2norm(key.to(dtype))
    return q.repeat_interleave(repeats, dim=-2), k.repeat_interleave(repeats, dim=-2)


def _chunk_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cum: torch.Tensor,
    beta: torch.Tensor,
    memory: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of the delta rule for ``[B, H, l, d]`` inputs; ``(out, memory)``.
    ``memory [B, H, dk, dv]`` is the state transposed; ``cum`` the in-chunk
    cumulative log decay. Sequential writes fold into one unit lower-triangular
    solve (UT transform): ``(I + A) [u | w] = [beta v | beta exp(cum) k]`` with
    ``A = strictly_lower(beta k k^T * exp(cum_i - cum_j))``; written values are
    ``u - w memory``."""
    size = cum.shape[-1]
    upper = torch.ones(size, size, dtype=torch.bool, device=cum.device).triu(1)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, -torch.inf).exp()
    k_beta = k * beta[..., None]
    system = (k_beta @ k.transpose(-1, -2)) * decay
    rhs = torch.cat([v * beta[..., None], k_beta * cum.exp()[..., None]], dim=-1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    u, w = solved.split([v.shape[-1], k.shape[-1]], dim=-1)
    written = u - w @ memory
    scores = (q @ k.transpose(-1, -2)) * decay
    out = (q * cum.exp()[..., None]) @ memory + scores @ written
    to_end = (cum[..., -1:] - cum).exp()[..., None]
    memory = (
        memory * cum[..., -1, None, None].exp()
        + (k * to_end).transpose(-1, -2) @ written
    )
    return out, memory


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    query_lens: torch.Tensor,
    chunk_size: int = 64,
) -> torch.Tensor:
    """The gated delta rule over padded prompt rows, writing the final states.
    ``q``/``k [B, Q, H, dk]``, ``v [B, Q, H, dv]``, ``g``/``beta [B, Q, H]``, ``state
    [slots, H, dv, dk]``; ``Q`` padded to ``chunk_size`` multiples with ``g = beta =
    0``, chunks in a static loop. Returns ``[B, Q, H, dv]`` in ``v``'s dtype."""
    num_tokens, out_dtype = q.shape[1], v.dtype
    dtype = compute_dtype(v.dtype)
    valid = valid_token_mask(query_lens, num_tokens)[..., None]
    pad = (-num_tokens) % chunk_size
    q, k, v = (
        F.pad(t.to(dtype), (0, 0, 0, 0, 0, pad)).transpose(1, 2) for t in (q, k, v)
    )
    g, beta = (
        F.pad((t.to(dtype) * valid), (0, 0, 0, pad)).transpose(1, 2) for t in (g, beta)
    )
    cum = g.unflatten(-1, (-1, chunk_size)).cumsum(dim=-1)
    initial = gather_initial_states(state, state_slots, has_initial_state)
    memory = initial.to(dtype).transpose(-1, -2)
    outs = []
    for n, start in enumerate(range(0, num_tokens + pad, chunk_size)):
        chunk = slice(start, start + chunk_size)
        out, memory = _chunk_step(
            q[:, :, chunk],
            k[:, :, chunk],
            v[:, :, chunk],
            cum[:, :, n],
            beta[:, :, chunk],
            memory,
        )
        outs.append(out)
    state.index_copy_(0, state_slots, memory.transpose(-1, -2).to(state.dtype))
    return torch.cat(outs, dim=2).transpose(1, 2)[:, :num_tokens].to(out_dtype)


def gated_delta_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
) -> torch.Tensor:
    """One recurrent step for decode rows (``q``/``k [B, H, dk]``, ``v [B, H, dv]``,
    ``g``/``beta [B, H]``); writes the new states, returns ``[B, H, dv]``."""
    dtype = compute_dtype(v.dtype)
    current = gather_initial_states(state, state_slots, has_initial_state).to(dtype)
    current = current * g.to(dtype).exp()[..., None, None]
    k, q, v = k.to(dtype), q.to(dtype), v.to(dtype)
    recalled = (current @ k[..., None])[..., 0]
    delta = (v - recalled) * beta.to(dtype)[..., None]
    current = current + delta[..., None] * k[:, :, None, :]
    state.index_copy_(0, state_slots, current.to(state.dtype))
    return (current @ q[..., None])[..., 0].to(v.dtype)
