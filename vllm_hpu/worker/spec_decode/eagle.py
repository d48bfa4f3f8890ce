"""The ``eagle``, ``eagle3`` and ``mtp`` proposers: a draft head reading the
target's hidden states (EAGLE-3: several layers' through its ``fc``; ``mtp``:
the target's own MTP layer, drafting as EAGLE-1).

As in vLLM's ``EagleProposer``, the head's KV at ``p`` comes from (token p + 1,
target state at p) and predicts token p + 2; the plugin's passes replace its
CUDA-graph buffers: (1) every target pass runs through the head with the same
bucket and metadata, tokens shifted one left per request (the last waits for
its next token: in the prompt, else sampled this step); (2) after sampling,
each row's first decode runs at its last verified position ``N - 2``, then
each draft with the head's own state, greedily. Every kept position then holds
the head's KV for the true next token: prefix caching and preemption just work."""

from dataclasses import replace
from typing import Any

import numpy as np
import torch
from vllm.config import set_current_vllm_config
from vllm.model_executor.model_loader import get_model
from vllm.model_executor.model_loader.utils import get_draft_load_config

from vllm_hpu.worker.passes.forward_pass import ForwardPass
from vllm_hpu.worker.spec_decode.draft_model import HpuDraftModelProposer
from vllm_hpu.worker.spec_decode.interface import TargetRunner


class HpuEagleProposer(HpuDraftModelProposer):
    # The first decode reads the last sampled token at the position before it.
    first_decode_offset = 2
    # The head's KV at a position needs the target's states there, from its passes.
    decodes_write_target_tokens = False

    def __init__(self, runner: TargetRunner):
        super().__init__(runner)
        spec = runner.vllm_config.speculative_config
        assert spec is not None
        self.num_speculative_tokens = spec.num_speculative_tokens
        # Per row: (first kept state's position, target states at its last 1 + k).
        self._target_hidden: dict[int, tuple[int, torch.Tensor]] = {}

    def _load(self) -> Any:
        """vLLM's loading of an EAGLE head or of the target's MTP layers."""
        spec = self.vllm_config.speculative_config
        assert spec is not None
        with set_current_vllm_config(self.vllm_config):
            self.model = get_model(
                vllm_config=self.vllm_config,
                model_config=spec.draft_model_config,
                load_config=get_draft_load_config(self.vllm_config),
            )
        share_target_weights(self.model, self.runner.get_model())
        return self.model

    def after_target_pass(self, forward_pass: ForwardPass, hidden: Any) -> Any:
        """Run the head over the pass; keep each row's last states."""
        for seq, last in zip(
            forward_pass.seqs, forward_pass.last_token_indices, strict=True
        ):
            count = min(
                seq.layout.num_scheduled_tokens, 1 + self.num_speculative_tokens
            )
            kept = hidden[last - count + 1 : last + 1].clone()
            self._target_hidden[seq.row] = (seq.end - count, kept)
        shifted = replace(forward_pass, input_ids=self._next_tokens(forward_pass))
        self._forward(shifted, hidden)
        return hidden

    def _next_tokens(self, forward_pass: ForwardPass) -> torch.Tensor:
        """Each token's successor: the pass's next token, or for a request's last the
        prompt's next (else 0 until sampled: the first decode rewrites it)."""
        batch = self.runner.input_batch
        next_ids = torch.roll(forward_pass.input_ids, -1)
        for seq, last in zip(
            forward_pass.seqs, forward_pass.last_token_indices, strict=True
        ):
            known = seq.end < batch.num_tokens_no_spec[seq.row]
            next_ids[last] = int(batch.token_ids_cpu[seq.row, seq.end]) if known else 0
        return next_ids

    def _first_hidden(self, rows: list[int], first: np.ndarray) -> torch.Tensor:
        """The target's hidden state at each row's last verified position."""
        states = []
        for row, position in zip(rows, first.tolist(), strict=True):
            start, kept = self._target_hidden[row]
            states.append(kept[position - start])
        self._target_hidden.clear()
        return torch.stack(states)


def share_target_weights(model: Any, target: Any) -> None:
    """The target's embeddings and LM head shared as vLLM does: always for MTP, for
    EAGLE where its checkpoint has none; each MTP ``shared_head.head`` too."""
    if not getattr(model, "has_own_embed_tokens", False):
        model.model.embed_tokens = target.model.embed_tokens
    if getattr(model, "has_own_lm_head", False):
        return
    model.lm_head = target.lm_head
    layers = getattr(model.model, "layers", ())
    if isinstance(layers, torch.nn.ModuleDict):  # DeepSeekMTP's, by layer index
        layers = layers.values()
    for layer in layers:
        shared_head = getattr(layer, "shared_head", None)
        if shared_head is not None and hasattr(shared_head, "head"):
            shared_head.head = target.lm_head


class HpuEagle3Proposer(HpuEagleProposer):
    """EAGLE-3: the head reads several target layers' states
    (``set_aux_hidden_state_layers``), combined by its ``fc``; a smaller draft
    vocabulary is mapped by the head's ``compute_logits``."""

    def _load(self) -> Any:
        model = super()._load()
        target = self.runner.get_model()
        if model.model.use_aux_hidden_state:
            if not hasattr(target, "set_aux_hidden_state_layers"):
                raise ValueError(
                    f"{type(target).__name__} does not give EAGLE-3 heads its "
                    "layers' hidden states in vLLM; use 'eagle' or 'draft_model'."
                )
            target.set_aux_hidden_state_layers(self._aux_layers(target))
        return model

    def _aux_layers(self, target: Any) -> tuple[int, ...]:
        """The head's layers to read (its config), or the target's default."""
        spec = self.vllm_config.speculative_config
        assert spec is not None
        config = spec.draft_model_config.hf_config
        eagle_config = getattr(config, "eagle_config", None) or {}
        layers = getattr(config, "eagle_aux_hidden_state_layer_ids", None)
        layers = layers or eagle_config.get("eagle_aux_hidden_state_layer_ids")
        if layers:
            return tuple(layers)
        return tuple(target.get_eagle3_default_aux_hidden_state_layers())

    def after_target_pass(self, forward_pass: ForwardPass, hidden: Any) -> Any:
        """The target returns (its output, states at the head's layers)."""
        if not isinstance(hidden, tuple):
            return super().after_target_pass(forward_pass, hidden)
        output, aux = hidden
        combined = self.model.combine_hidden_states(torch.cat(aux, dim=-1))
        super().after_target_pass(forward_pass, combined)
        return output
