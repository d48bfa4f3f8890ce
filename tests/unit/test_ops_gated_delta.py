"""Gated delta-net ops against transformers' own torch fallbacks (Qwen3-Next).

Random inputs in float32 and float64 (the references compute in float32, hence
the tolerances), two key heads repeated to four value heads: padded mixed-length
rows with and without initial states, splits with the state carried, a prompt
followed by decode steps, stale and foreign slots untouched, vLLM's ``(v_heads,
dv, dk)`` state layout (the reference's state is ``[dk, dv]``).
"""

import math

import pytest
import torch
from transformers.models.qwen3_next import modeling_qwen3_next as hf

from vllm_hpu.ops.gated_delta import (
    chunk_gated_delta_rule,
    gated_delta_step,
    gdn_gating,
    normalize_qk,
)

DTYPES = [torch.float32, torch.float64]
K_HEADS, V_HEADS, DK, DV = 2, 4, 8, 6
NUM_SLOTS = 6  # slot 5 plays the dummy


TOL = {"atol": 2e-5, "rtol": 1e-4}


def _inputs(batch: int, length: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Raw projections: q/k on the key heads, v/a/b on the value heads."""
    return {
        "q": torch.randn(batch, length, K_HEADS, DK, dtype=dtype),
        "k": torch.randn(batch, length, K_HEADS, DK, dtype=dtype),
        "v": torch.randn(batch, length, V_HEADS, DV, dtype=dtype),
        "a": torch.randn(batch, length, V_HEADS, dtype=dtype),
        "b": torch.randn(batch, length, V_HEADS, dtype=dtype),
    }


def _params(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {
        "A_log": torch.randn(V_HEADS, dtype=dtype) * 0.5,
        "dt_bias": torch.randn(V_HEADS, dtype=dtype) * 0.5,
    }


def _prepared(inputs, params, start=0, stop=None):
    """Op inputs for tokens [start, stop): (q, k, v, g, beta)."""
    sl = {key: t[:, start:stop] for key, t in inputs.items()}
    q, k = normalize_qk(sl["q"], sl["k"], V_HEADS)
    g, beta = gdn_gating(sl["a"], sl["b"], params["A_log"], params["dt_bias"])
    return q, k, sl["v"], g, beta


def _reference(inputs, params, row, n, initial, recurrent=False):
    """transformers on one row's first n tokens: (out [n, H, dv], state [H, dv, dk])."""
    sl = {key: t[row : row + 1, :n] for key, t in inputs.items()}
    q, k = (t.repeat_interleave(V_HEADS // K_HEADS, dim=2) for t in (sl["q"], sl["k"]))
    g = -params["A_log"].exp() * torch.nn.functional.softplus(
        sl["a"] + params["dt_bias"]
    )
    beta = sl["b"].sigmoid()
    hf_initial = None if initial is None else initial.transpose(-1, -2)[None]
    fn = (
        hf.torch_recurrent_gated_delta_rule
        if recurrent
        else hf.torch_chunk_gated_delta_rule
    )
    out, final = fn(
        q,
        k,
        sl["v"],
        g,
        beta,
        initial_state=hf_initial,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    dtype = sl["v"].dtype
    return out[0].to(dtype), final[0].transpose(-1, -2).to(dtype)


def test_gating_matches_its_formula() -> None:
    a, b = torch.randn(3, V_HEADS, dtype=torch.float64), torch.randn(3, V_HEADS)
    params = _params(torch.float64)
    g, beta = gdn_gating(a, b, params["A_log"], params["dt_bias"])
    for i, h in ((0, 0), (2, 3)):
        x = float(a[i, h] + params["dt_bias"][h])
        assert g[i, h].item() == pytest.approx(
            -math.exp(params["A_log"][h]) * math.log1p(math.exp(x))
        )
        assert beta[i, h].item() == pytest.approx(1 / (1 + math.exp(-float(b[i, h]))))
    assert g.dtype == beta.dtype == torch.float64  # both follow a's dtype


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk_size", [4, 16, 64])
def test_chunk_rule_padded_rows_match_reference(
    dtype: torch.dtype, chunk_size: int
) -> None:
    torch.manual_seed(0)
    lens = torch.tensor([19, 2, 11, 0])
    slots = torch.tensor([4, 0, 2, 5])
    has_initial = torch.tensor([True, False, True, False])
    inputs, params = _inputs(4, 19, dtype), _params(dtype)
    state = torch.randn(NUM_SLOTS, V_HEADS, DV, DK, dtype=dtype) * 0.3
    before = state.clone()
    out = chunk_gated_delta_rule(
        *_prepared(inputs, params), state, slots, has_initial, lens, chunk_size
    )
    assert out.shape == inputs["v"].shape and out.dtype == dtype
    for row in range(3):
        slot, n = int(slots[row]), int(lens[row])
        initial = before[slot] if has_initial[row] else None
        ref_out, ref_state = _reference(inputs, params, row, n, initial)
        torch.testing.assert_close(out[row, :n], ref_out, **TOL)
        torch.testing.assert_close(state[slot], ref_state, **TOL)
    for untouched in (1, 3):
        torch.testing.assert_close(state[untouched], before[untouched])


def _rows(inputs, params, state, start, stop, has_initial, chunk_size):
    batch = inputs["v"].shape[0]
    return chunk_gated_delta_rule(
        *_prepared(inputs, params, start, stop),
        state,
        torch.arange(batch),
        torch.full((batch,), has_initial),
        torch.full((batch,), stop - start),
        chunk_size,
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_chunk_rule_split_with_carried_state_equals_one_pass(
    dtype: torch.dtype,
) -> None:
    torch.manual_seed(1)
    inputs, params = _inputs(2, 70, dtype), _params(dtype)
    whole_state = torch.zeros(2, V_HEADS, DV, DK, dtype=dtype)
    whole = _rows(inputs, params, whole_state, 0, 70, False, 64)
    state = torch.full_like(whole_state, float("nan"))  # stale slots must never be read
    parts = [
        _rows(inputs, params, state, a, b, a > 0, cs)
        for a, b, cs in ((0, 5, 64), (5, 48, 16), (48, 70, 64))
    ]
    torch.testing.assert_close(torch.cat(parts, 1), whole, **TOL)
    torch.testing.assert_close(state, whole_state, **TOL)
    ref_out, ref_state = _reference(inputs, params, 0, 70, None)
    torch.testing.assert_close(whole[0], ref_out, **TOL)
    torch.testing.assert_close(whole_state[0], ref_state, **TOL)


@pytest.mark.parametrize("dtype", DTYPES)
def test_prompt_then_decode_steps_equal_recurrent_reference(dtype: torch.dtype) -> None:
    torch.manual_seed(2)
    inputs, params = _inputs(2, 12, dtype), _params(dtype)
    state = torch.zeros(NUM_SLOTS, V_HEADS, DV, DK, dtype=dtype)
    slots = torch.tensor([3, 1])
    prompt = chunk_gated_delta_rule(
        *_prepared(inputs, params, 0, 8),
        state,
        slots,
        torch.tensor([False, False]),
        torch.tensor([8, 8]),
        4,
    )
    steps = []
    for t in range(8, 12):
        q, k, v, g, beta = (x[:, 0] for x in _prepared(inputs, params, t, t + 1))
        steps.append(
            gated_delta_step(q, k, v, g, beta, state, slots, torch.tensor([True, True]))
        )
    out = torch.cat([prompt, torch.stack(steps, 1)], 1)
    for row in range(2):
        ref_out, ref_state = _reference(inputs, params, row, 12, None, recurrent=True)
        torch.testing.assert_close(out[row], ref_out, **TOL)
        torch.testing.assert_close(state[int(slots[row])], ref_state, **TOL)


@pytest.mark.parametrize("dtype", DTYPES)
def test_step_matches_reference_and_ignores_stale_slots(dtype: torch.dtype) -> None:
    torch.manual_seed(3)
    inputs, params = _inputs(3, 1, dtype), _params(dtype)
    state = torch.randn(NUM_SLOTS, V_HEADS, DV, DK, dtype=dtype) * 0.3
    state[1] = float("nan")  # a freed slot's garbage, read by a first step
    before = state.clone()
    slots, has_initial = torch.tensor([3, 1, 5]), torch.tensor([True, False, False])
    q, k, v, g, beta = (x[:, 0] for x in _prepared(inputs, params))
    out = gated_delta_step(q, k, v, g, beta, state, slots, has_initial)
    for row in range(2):
        slot = int(slots[row])
        initial = before[slot] if has_initial[row] else None
        ref_out, ref_state = _reference(inputs, params, row, 1, initial, recurrent=True)
        torch.testing.assert_close(out[row], ref_out[0], **TOL)
        torch.testing.assert_close(state[slot], ref_state, **TOL)
    for untouched in (0, 2, 4):
        torch.testing.assert_close(state[untouched], before[untouched])
