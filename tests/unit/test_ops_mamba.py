"""Mamba2 ops against transformers' own torch fallbacks (Granite-4.0-H's modeling).

Each case is checked per row against the reference on random inputs, in float32
and float64 (the reference scan computes in float32, hence the tolerances):
padded mixed-length rows with and without initial states, prompts split at
arbitrary points with the state carried, a prompt followed by decode steps, and
slots other than the rows' own left untouched.
"""

import pytest
import torch
from transformers.models.granitemoehybrid import modeling_granitemoehybrid as hf

from vllm_hpu.ops.mamba import (
    causal_conv1d_decode,
    causal_conv1d_prompt,
    mamba_chunk_scan,
    mamba_state_step,
)

DTYPES = [torch.float32, torch.float64]
HEADS, HEAD_DIM, GROUPS, D_STATE, CONV_DIM, WIDTH = 4, 3, 2, 5, 6, 4
NUM_SLOTS = 6  # slot 5 plays the dummy


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return (
        {"atol": 1e-4, "rtol": 1e-4}
        if dtype == torch.float32
        else {"atol": 1e-5, "rtol": 1e-5}
    )


def _conv_params(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(CONV_DIM, WIDTH, dtype=dtype), torch.randn(CONV_DIM, dtype=dtype)


def _reference_conv(x_row, state_row, has_initial, weight, bias):
    """transformers' update path on one row: (out [L, C], new state [K-1, C])."""
    hf_state = torch.zeros(1, CONV_DIM, WIDTH, dtype=x_row.dtype)
    if has_initial:
        hf_state[0, :, 1:] = state_row.T
    out = hf.causal_conv1d_update(x_row.T[None].clone(), hf_state, weight, bias, "silu")
    return out[0].T, hf_state[0, :, 1:].T


@pytest.mark.parametrize("dtype", DTYPES)
def test_conv_prompt_padded_rows_match_reference(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    weight, bias = _conv_params(dtype)
    lens = torch.tensor(
        [7, 1, 2, 5, 0]
    )  # 1 and 2 < K - 1: the new state keeps old entries
    slots = torch.tensor([2, 0, 4, 1, 5])
    has_initial = torch.tensor([True, True, False, True, False])
    x = torch.randn(5, 7, CONV_DIM, dtype=dtype)
    conv_state = torch.randn(NUM_SLOTS, WIDTH - 1, CONV_DIM, dtype=dtype)
    before = conv_state.clone()
    out = causal_conv1d_prompt(x, conv_state, weight, bias, slots, has_initial, lens)
    for row in range(4):
        n, slot = int(lens[row]), int(slots[row])
        ref_out, ref_state = _reference_conv(
            x[row, :n], before[slot], bool(has_initial[row]), weight, bias
        )
        torch.testing.assert_close(out[row, :n], ref_out, **_tol(dtype))
        torch.testing.assert_close(conv_state[slot], ref_state, **_tol(dtype))
    torch.testing.assert_close(conv_state[3], before[3])  # nobody's slot: untouched


@pytest.mark.parametrize("dtype", DTYPES)
def test_conv_prompt_then_decode_equals_one_pass(dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    weight, bias = _conv_params(dtype)
    x = torch.randn(2, 9, CONV_DIM, dtype=dtype)
    no_init = torch.tensor([False, False])
    slots = torch.tensor([3, 1])
    whole_state = torch.zeros(NUM_SLOTS, WIDTH - 1, CONV_DIM, dtype=dtype)
    whole = causal_conv1d_prompt(
        x, whole_state, weight, bias, slots, no_init, torch.tensor([9, 9])
    )
    state = torch.randn(NUM_SLOTS, WIDTH - 1, CONV_DIM, dtype=dtype)
    first = causal_conv1d_prompt(
        x[:, :6], state, weight, bias, slots, no_init, torch.tensor([6, 6])
    )
    steps = [
        causal_conv1d_decode(x[:, t], state, weight, bias, slots, ~no_init)
        for t in range(6, 9)
    ]
    torch.testing.assert_close(torch.cat([first, torch.stack(steps, 1)], 1), whole)
    torch.testing.assert_close(state[slots], whole_state[slots])


def _scan_inputs(
    batch: int, length: int, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    return {
        "x": torch.randn(batch, length, HEADS, HEAD_DIM, dtype=dtype),
        "dt": torch.randn(batch, length, HEADS, dtype=dtype),
        "B": torch.randn(batch, length, GROUPS, D_STATE, dtype=dtype) * 0.5,
        "C": torch.randn(batch, length, GROUPS, D_STATE, dtype=dtype) * 0.5,
    }


def _scan_params(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {
        "A": -torch.rand(HEADS, dtype=dtype).exp(),
        "D": torch.randn(HEADS, dtype=dtype),
        "dt_bias": torch.randn(HEADS, dtype=dtype) * 0.5,
    }


def _reference_scan(inputs, params, row, n, initial):
    """transformers' chunked scan of one row's first n tokens: (y, final state)."""
    sliced = {k: v[row : row + 1, :n] for k, v in inputs.items()}
    y, final = hf.mamba2_chunk_scan(
        sliced["x"],
        sliced["dt"],
        params["A"],
        sliced["B"],
        sliced["C"],
        16,
        D=params["D"],
        dt_bias=params["dt_bias"],
        initial_states=initial,
        dt_softplus=True,
        return_final_states=True,
    )
    dtype = inputs["x"].dtype
    return y[0].to(dtype), final[0].to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk_size", [4, 8, 32])
def test_chunk_scan_padded_rows_match_reference(
    dtype: torch.dtype, chunk_size: int
) -> None:
    torch.manual_seed(2)
    lens = torch.tensor([21, 3, 17, 0])
    slots = torch.tensor([4, 0, 2, 5])
    has_initial = torch.tensor([True, False, True, False])
    inputs, params = _scan_inputs(4, 21, dtype), _scan_params(dtype)
    ssm_state = torch.randn(NUM_SLOTS, HEADS, HEAD_DIM, D_STATE, dtype=dtype)
    before = ssm_state.clone()
    y = mamba_chunk_scan(
        **inputs,
        **params,
        ssm_state=ssm_state,
        state_slots=slots,
        has_initial_state=has_initial,
        query_lens=lens,
        chunk_size=chunk_size,
    )
    assert y.shape == inputs["x"].shape and y.dtype == dtype
    for row in range(3):
        slot, n = int(slots[row]), int(lens[row])
        initial = before[slot : slot + 1] if has_initial[row] else None
        ref_y, ref_final = _reference_scan(inputs, params, row, n, initial)
        torch.testing.assert_close(y[row, :n], ref_y, **_tol(dtype))
        torch.testing.assert_close(ssm_state[slot], ref_final, **_tol(dtype))
    for untouched in (1, 3):
        torch.testing.assert_close(ssm_state[untouched], before[untouched])


def _scan_rows(inputs, params, ssm_state, start, stop, has_initial, chunk_size):
    """One prompt pass of tokens [start, stop) for every row, slots = row index."""
    batch = inputs["x"].shape[0]
    return mamba_chunk_scan(
        **{k: v[:, start:stop] for k, v in inputs.items()},
        **params,
        ssm_state=ssm_state,
        state_slots=torch.arange(batch),
        has_initial_state=torch.full((batch,), has_initial),
        query_lens=torch.full((batch,), stop - start),
        chunk_size=chunk_size,
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_chunk_scan_split_with_carried_state_equals_one_pass(
    dtype: torch.dtype,
) -> None:
    torch.manual_seed(3)
    inputs, params = _scan_inputs(2, 40, dtype), _scan_params(dtype)
    whole_state = torch.zeros(2, HEADS, HEAD_DIM, D_STATE, dtype=dtype)
    whole = _scan_rows(inputs, params, whole_state, 0, 40, False, 16)
    state = torch.full_like(whole_state, float("nan"))  # stale slots must never be read
    parts = [
        _scan_rows(inputs, params, state, a, b, a > 0, cs)
        for a, b, cs in ((0, 13, 16), (13, 27, 8), (27, 40, 16))
    ]
    torch.testing.assert_close(torch.cat(parts, 1), whole, **_tol(dtype))
    torch.testing.assert_close(state, whole_state, **_tol(dtype))
    ref_y, ref_final = _reference_scan(inputs, params, 1, 40, None)
    torch.testing.assert_close(whole[1], ref_y, **_tol(dtype))
    torch.testing.assert_close(whole_state[1], ref_final, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_prompt_then_decode_steps_equal_whole_sequence(dtype: torch.dtype) -> None:
    torch.manual_seed(4)
    inputs, params = _scan_inputs(2, 15, dtype), _scan_params(dtype)
    state = torch.zeros(2, HEADS, HEAD_DIM, D_STATE, dtype=dtype)
    prompt = _scan_rows(inputs, params, state, 0, 10, False, 8)
    steps = [
        mamba_state_step(
            **{k: v[:, t] for k, v in inputs.items()},
            **params,
            ssm_state=state,
            state_slots=torch.arange(2),
            has_initial_state=torch.tensor([True, True]),
        )
        for t in range(10, 15)
    ]
    y = torch.cat([prompt, torch.stack(steps, 1)], 1)
    for row in range(2):
        ref_y, ref_final = _reference_scan(inputs, params, row, 15, None)
        torch.testing.assert_close(y[row], ref_y, **_tol(dtype))
        torch.testing.assert_close(state[row], ref_final, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_state_step_matches_reference_and_ignores_stale_slots(
    dtype: torch.dtype,
) -> None:
    torch.manual_seed(5)
    inputs = {k: v[:, 0] for k, v in _scan_inputs(3, 1, dtype).items()}
    params = _scan_params(dtype)
    ssm_state = torch.randn(NUM_SLOTS, HEADS, HEAD_DIM, D_STATE, dtype=dtype)
    ssm_state[1] = float("nan")  # a freed slot's garbage, read by a first step
    before = ssm_state.clone()
    slots, has_initial = torch.tensor([3, 1, 5]), torch.tensor([True, False, False])
    y = mamba_state_step(
        **inputs,
        **params,
        ssm_state=ssm_state,
        state_slots=slots,
        has_initial_state=has_initial,
    )
    for row in range(2):
        slot = int(slots[row])
        ref_state = (
            before[slot : slot + 1].clone()
            if has_initial[row]
            else torch.zeros_like(before[:1])
        )
        ref_y = hf.mamba2_selective_state_update(
            ref_state,
            inputs["x"][row : row + 1],
            inputs["dt"][row : row + 1, :, None].expand(1, HEADS, HEAD_DIM),
            params["A"][:, None, None].expand(HEADS, HEAD_DIM, D_STATE),
            inputs["B"][row : row + 1],
            inputs["C"][row : row + 1],
            D=params["D"][:, None].expand(HEADS, HEAD_DIM),
            dt_bias=params["dt_bias"][:, None].expand(HEADS, HEAD_DIM),
            dt_softplus=True,
        )
        torch.testing.assert_close(y[row], ref_y[0], **_tol(dtype))
        torch.testing.assert_close(ssm_state[slot], ref_state[0], **_tol(dtype))
    for untouched in (0, 2, 4):
        torch.testing.assert_close(ssm_state[untouched], before[untouched])
