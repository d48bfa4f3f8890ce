"""HPU versions of vLLM's state-space layers, registered out of tree.

vLLM's ``MambaMixer2`` runs its convolution and selective scan as Triton (or
``vllm._C``) kernels over varlen batches, reading ``Mamba2AttentionMetadata``.
``HpuMambaMixer2`` keeps everything else of the layer (projections, gated norm,
weight loading, state spec) and replaces only that core with the plain-torch ops
of ``ops/mamba.py`` over the runner's padded passes, reading
``HpuStateMetadata`` (attention/state_metadata.py) from the forward context.
"""

import torch
from vllm.forward_context import get_forward_context
from vllm.model_executor.custom_op import op_registry_oot
from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2

from vllm_hpu.attention.state_metadata import HpuStateMetadata
from vllm_hpu.ops.mamba import (
    causal_conv1d_decode,
    causal_conv1d_prompt,
    mamba_chunk_scan,
    mamba_state_step,
)


class HpuMambaMixer2(MambaMixer2):
    conv_weights: torch.Tensor  # [conv_dim, K], a buffer vLLM registers

    def conv_ssm_forward(
        self, projected_states: torch.Tensor, output: torch.Tensor
    ) -> None:
        """Conv and scan of one pass; fills ``output [num_tokens, H * P]`` and
        updates each row's conv and SSM state in its slot."""
        layer_metadata = get_forward_context().attn_metadata
        assert isinstance(layer_metadata, dict), "the runner maps layers"
        metadata = layer_metadata[self.prefix]
        assert isinstance(metadata, HpuStateMetadata), type(metadata)
        xbc, dt = torch.split(
            projected_states[..., self.tped_intermediate_size :],
            [self.tped_conv_size, self.tped_dt_size],
            dim=-1,
        )
        if metadata.is_prompt:
            y = self._prompt(xbc, dt, metadata)
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


def register_state_layers() -> None:
    """vLLM then builds these classes in place of its own (PluggableLayer);
    register_oot asserts on duplicates, and plugins load more than once."""
    if MambaMixer2.__name__ not in op_registry_oot:
        MambaMixer2.register_oot(HpuMambaMixer2)
