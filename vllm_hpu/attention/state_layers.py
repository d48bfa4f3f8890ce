"""HPU versions of vLLM's state-space layers, registered out of tree.

vLLM's ``MambaMixer2`` and ``QwenGatedDeltaNetAttention`` run their convolution
and scan as Triton (or ``vllm._C``) kernels over varlen batches, reading vLLM's
Mamba2 / GDN metadata. The subclasses here keep everything else of the layers
(projections, gated norms, weight loading, state specs) and replace only that
core with the plain-torch ops of ``ops/mamba.py`` and ``ops/gated_delta.py``
over the runner's padded passes, reading ``HpuStateMetadata``
(attention/state_metadata.py) from the forward context. A verification pass
(speculative decoding) runs as one decode step per draft position.
"""

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import cast

import torch
from vllm.config import VllmConfig
from vllm.forward_context import get_forward_context
from vllm.model_executor.custom_op import op_registry_oot
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
    QwenGatedDeltaNetAttention,
)
from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
from vllm.v1.kv_cache_interface import KVCacheSpec, MambaSpec

from vllm_hpu.attention.state_metadata import HpuStateMetadata
from vllm_hpu.ops.gated_delta import (
    chunk_gated_delta_rule,
    gated_delta_step,
    gdn_gating,
    normalize_qk,
)
from vllm_hpu.ops.mamba import (
    causal_conv1d_decode,
    causal_conv1d_prompt,
    mamba_chunk_scan,
    mamba_state_step,
)


class HpuMambaMixer2(MambaMixer2):
    conv_weights: torch.Tensor  # [conv_dim, K], a buffer vLLM registers

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> KVCacheSpec | None:
        """vLLM's spec without its in-pass prefill checkpoint: the passes here
        save a state only at a pass's end, so with prefix caching vLLM's
        scheduler ends prefill chunks on block boundaries instead."""
        spec = super().get_kv_cache_spec(vllm_config)
        if not isinstance(spec, MambaSpec):
            return spec
        return replace(
            spec, num_prefill_checkpoint_blocks=0, prefill_checkpoint_alignment=None
        )

    def conv_ssm_forward(
        self, projected_states: torch.Tensor, output: torch.Tensor
    ) -> None:
        """Conv and scan of one pass; fills ``output [num_tokens, H * P]`` and
        updates each row's conv and SSM state in its slot."""
        metadata = _state_metadata(self.prefix)
        xbc, dt = torch.split(
            projected_states[..., self.tped_intermediate_size :],
            [self.tped_conv_size, self.tped_dt_size],
            dim=-1,
        )
        if metadata.is_prompt:
            y = self._prompt(xbc, dt, metadata)
        elif metadata.verify is not None:
            y = verify_steps(self.kv_cache, metadata, self._decode, xbc, dt)
        else:
            y = self._decode(xbc, dt, metadata)
        output.copy_(y.reshape(output.shape))

    def _prompt(
        self, xbc: torch.Tensor, dt: torch.Tensor, metadata: HpuStateMetadata
    ) -> torch.Tensor:
        """``[B*Q]`` tokens as ``B`` rows of ``Q``: conv, then the chunked scan."""
        conv_state, ssm_state = self.kv_cache[0], self.kv_cache[1]
        batch_size = metadata.state_slots.shape[0]
        xbc = causal_conv1d_prompt(
            xbc.view(batch_size, -1, xbc.shape[-1]),
            conv_state,
            self.conv_weights,
            self.conv1d.bias,
            metadata.state_slots,
            metadata.has_initial_state,
            metadata.query_lens,
            self.activation,
        )
        x, b, c = self.split_hidden_states_B_C_fn(xbc)
        rows = x.shape[:2]
        return mamba_chunk_scan(
            x.reshape(*rows, self.tped_dt_size, self.head_dim),
            dt.view(*rows, self.tped_dt_size),
            self.A,
            b.reshape(*rows, -1, self.ssm_state_size),
            c.reshape(*rows, -1, self.ssm_state_size),
            self.D,
            self.dt_bias,
            ssm_state,
            metadata.state_slots,
            metadata.has_initial_state,
            metadata.query_lens,
            self._chunk_size(rows[1]),
        )

    def _decode(
        self, xbc: torch.Tensor, dt: torch.Tensor, metadata: HpuStateMetadata
    ) -> torch.Tensor:
        """One token per row: a conv step, then a recurrent step."""
        conv_state, ssm_state = self.kv_cache[0], self.kv_cache[1]
        xbc = causal_conv1d_decode(
            xbc,
            conv_state,
            self.conv_weights,
            self.conv1d.bias,
            metadata.state_slots,
            metadata.has_initial_state,
            self.activation,
        )
        x, b, c = self.split_hidden_states_B_C_fn(xbc)
        num_rows = x.shape[0]
        return mamba_state_step(
            x.reshape(num_rows, self.tped_dt_size, self.head_dim),
            dt,
            self.A,
            b.reshape(num_rows, -1, self.ssm_state_size),
            c.reshape(num_rows, -1, self.ssm_state_size),
            self.D,
            self.dt_bias,
            ssm_state,
            metadata.state_slots,
            metadata.has_initial_state,
        )

    def _chunk_size(self, query_len: int) -> int:
        """The model's scan chunk, or the whole row when shorter: the result
        does not depend on it beyond rounding (ops/mamba.py)."""
        assert self.model_config is not None
        return min(self.model_config.get_mamba_chunk_size(), query_len)


class HpuQwenGatedDeltaNet(QwenGatedDeltaNetAttention):
    def _forward_core(
        self,
        mixed_qkv: torch.Tensor,
        b: torch.Tensor,
        a: torch.Tensor,
        core_attn_out: torch.Tensor,
    ) -> None:
        """Conv and gated delta rule of one pass on ``mixed_qkv [num_tokens,
        q | k | v]`` and the gates ``b``/``a [num_tokens, v_heads]``; fills
        ``core_attn_out [num_tokens, v_heads, dv]`` and updates each row's
        conv and recurrent state in its slot."""
        metadata = _state_metadata(self.prefix)
        if metadata.verify is not None:
            out = verify_steps(self.kv_cache, metadata, self._rows, mixed_qkv, b, a)
        else:
            out = self._rows(mixed_qkv, b, a, metadata)
        core_attn_out.copy_(out.reshape(core_attn_out.shape))

    def _rows(
        self,
        mixed_qkv: torch.Tensor,
        b: torch.Tensor,
        a: torch.Tensor,
        metadata: HpuStateMetadata,
    ) -> torch.Tensor:
        """The pass's prompt or decode rows; ``[num_tokens, v_heads, dv]``."""
        num_rows = metadata.state_slots.shape[0]
        # Prompt rows [B, Q]; decode rows [B].
        rows: tuple[int, ...] = (num_rows, mixed_qkv.shape[0] // num_rows)
        if not metadata.is_prompt:
            rows = rows[:1]
        conv_state, state = self.kv_cache[0], self.kv_cache[1]
        mixed_qkv = self._conv(mixed_qkv.view(*rows, -1), conv_state, metadata)
        query, key, value = torch.split(
            mixed_qkv,
            [self.key_dim // self.tp_size] * 2 + [self.value_dim // self.tp_size],
            dim=-1,
        )
        num_v_heads = self.num_v_heads // self.tp_size
        q, k = normalize_qk(
            query.unflatten(-1, (-1, self.head_k_dim)),
            key.unflatten(-1, (-1, self.head_k_dim)),
            num_v_heads,
        )
        v = value.unflatten(-1, (-1, self.head_v_dim))
        g, beta = gdn_gating(
            a.view(*rows, -1), b.view(*rows, -1), self.A_log, self.dt_bias
        )
        slots, initial = metadata.state_slots, metadata.has_initial_state
        if metadata.is_prompt:
            out = chunk_gated_delta_rule(
                q, k, v, g, beta, state, slots, initial, metadata.query_lens
            )
            return out.flatten(0, 1)
        return gated_delta_step(q, k, v, g, beta, state, slots, initial)

    def _conv(
        self,
        mixed_qkv: torch.Tensor,
        conv_state: torch.Tensor,
        metadata: HpuStateMetadata,
    ) -> torch.Tensor:
        """The causal conv over ``[B, Q, C]`` prompt rows or ``[B, C]`` decode
        rows (vLLM keeps the conv weight ``[C, 1, K]``)."""
        weight = cast(torch.Tensor, self.conv1d.weight).flatten(1)
        slots, initial = metadata.state_slots, metadata.has_initial_state
        conv = (mixed_qkv, conv_state, weight, self.conv1d.bias, slots, initial)
        if metadata.is_prompt:
            return causal_conv1d_prompt(*conv, metadata.query_lens, self.activation)
        return causal_conv1d_decode(*conv, self.activation)


def verify_steps(
    kv_cache: Sequence[torch.Tensor],
    metadata: HpuStateMetadata,
    step: Callable[..., torch.Tensor],
    *inputs: torch.Tensor,
) -> torch.Tensor:
    """A verification pass as ``Q`` decode steps: step ``j`` runs each row's
    ``j``-th token (``inputs [num_tokens, ...]``, gathered) on its slot, then
    keeps every slot's page (conv and recurrent state) in its snapshot, so
    the next step resumes from the last accepted token's. Returns the step
    outputs at their tokens, ``[num_tokens, ...]``."""
    verify = metadata.verify
    assert verify is not None
    num_tokens = inputs[0].shape[0]
    padded = [torch.cat([x, x.new_zeros((1, *x.shape[1:]))]) for x in inputs]
    out: torch.Tensor | None = None
    for j in range(verify.tokens.shape[1]):
        index, slots = verify.tokens[:, j], verify.slots[:, j]
        rows = [x.index_select(0, index) for x in padded]
        y = step(*rows, replace(metadata, state_slots=slots, verify=None))
        for cache in kv_cache:
            cache.index_copy_(0, verify.snapshots[:, j], cache.index_select(0, slots))
        if out is None:
            out = y.new_zeros((num_tokens + 1, *y.shape[1:]))
        out.index_copy_(0, index, y)
    assert out is not None
    return out[:num_tokens]


def _state_metadata(layer_name: str) -> HpuStateMetadata:
    layer_metadata = get_forward_context().attn_metadata
    assert isinstance(layer_metadata, dict), "the runner maps each layer"
    metadata = layer_metadata[layer_name]
    assert isinstance(metadata, HpuStateMetadata), type(metadata)
    return metadata


def register_state_layers() -> None:
    """vLLM then builds these classes in place of its own (PluggableLayer);
    register_oot asserts on duplicates, and plugins load more than once."""
    for base, layer in (
        (MambaMixer2, HpuMambaMixer2),
        (QwenGatedDeltaNetAttention, HpuQwenGatedDeltaNet),
    ):
        if base.__name__ not in op_registry_oot:
            base.register_oot(layer)
