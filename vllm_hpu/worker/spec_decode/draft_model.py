"""The ``draft_model`` proposer: a smaller model with the target's tokenizer and
its own KV cache in the target's blocks, loaded under prefix ``draft_model``
into the same forward context, so vLLM sizes one KV cache config over both,
indexed by the same block tables. Instead of vLLM's CUDA-graph drafting, the
plugin's passes (so warmup compiles them): (1) each sampling row drafts ``k``
tokens greedily in ``k`` decode passes (into the lookahead slots), verified as
n-gram drafts are; (2) every target pass the draft has not seen runs through
it too (``after_target_pass``); where every draft was accepted, the next
proposal's first decode reads the last one, saving a decode over all rows."""

from typing import Any

import numpy as np
import torch
from vllm.config import (
    VllmConfig,
    get_layers_from_vllm_config,
    replace,
    set_current_vllm_config,
)
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.model_executor.model_loader import get_model

from vllm_hpu import device
from vllm_hpu.attention.metadata import SeqLayout
from vllm_hpu.quantization.moe_methods import check_moe_layers
from vllm_hpu.worker.compilation.execution import (
    CompileOptions,
    ExecutionMode,
    GraphedModel,
)
from vllm_hpu.worker.passes.build import build_decode_pass
from vllm_hpu.worker.passes.forward_pass import ForwardPass
from vllm_hpu.worker.passes.seqs import ScheduledSeq
from vllm_hpu.worker.spec_decode.interface import Proposer, TargetRunner


def draft_vllm_config(vllm_config: VllmConfig) -> VllmConfig:
    """The target's config with the draft's model and parallel config, as
    vLLM's ``DraftModelProposer._create_draft_vllm_config`` builds it."""
    spec = vllm_config.speculative_config
    assert spec is not None and spec.draft_model_config is not None
    return replace(
        vllm_config,
        quant_config=None,
        parallel_config=replace(
            spec.draft_parallel_config, rank=vllm_config.parallel_config.rank
        ),
        model_config=spec.draft_model_config,
    )


def attention_layer_names(vllm_config: VllmConfig) -> set[str]:
    return set(
        get_layers_from_vllm_config(
            vllm_config,
            AttentionLayerBase,  # type: ignore[type-abstract]
        )
    )


class HpuDraftModelProposer(Proposer):
    """The draft beside the target, mirroring its passes, drafting greedily."""

    # The first draft decode's position, counted back from the row's token
    # count: the draft model reads the last sampled token at its own position.
    first_decode_offset = 1
    # The draft's decodes write the KV of the tokens it reads, as the target's
    # passes do: a pass over tokens they wrote needs no mirroring.
    decodes_write_target_tokens = True

    def __init__(self, runner: TargetRunner):
        spec = runner.vllm_config.speculative_config
        assert spec is not None
        spec.verify_equal_vocab_size_if_draft_model()
        self.runner = runner
        self.vllm_config = runner.vllm_config
        self.max_model_len = runner.vllm_config.model_config.max_model_len
        self.model: Any = None
        self.graphed_model: GraphedModel  # set by load_model
        self.layer_names: list[str] = []
        # Per request: positions [start, end) the last proposal wrote to the draft's KV.
        self._written: dict[str, tuple[int, int]] = {}

    def load_model(self) -> None:
        """Load the draft after the target: the layers it adds are its own."""
        target_layers = attention_layer_names(self.vllm_config)
        self.model = self._load()
        check_moe_layers(self.model)
        if self.runner.execution_mode is ExecutionMode.EAGER:
            device.prepare_weights(self.model)
        self.layer_names = sorted(
            attention_layer_names(self.vllm_config) - target_layers
        )
        self.graphed_model = GraphedModel(
            self.model, self.vllm_config, self.runner.graphed_buckets
        )

    def _load(self) -> Any:
        draft_config = draft_vllm_config(self.vllm_config)
        with set_current_vllm_config(draft_config):
            return get_model(vllm_config=draft_config, prefix="draft_model")

    def prepare(self, mode: ExecutionMode, options: CompileOptions | None) -> None:
        """Apply the runner's execution mode to the draft (warmup)."""
        self.graphed_model.prepare(mode, options)

    def _forward(
        self, forward_pass: ForwardPass, hidden_states: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(states for logits, states the next decode reads): a head returning one
        tensor reads it back (vLLM's rule for MTP); a draft model reads only tokens."""
        inputs = {
            "input_ids": forward_pass.input_ids,
            "positions": forward_pass.positions,
        }
        if hidden_states is not None:
            inputs["hidden_states"] = hidden_states
        metadata = forward_pass.metadata_by_layer(self._layer_groups())
        output = self.graphed_model.run(forward_pass, inputs, metadata)
        return output if isinstance(output, tuple) else (output, output)

    def after_target_pass(self, forward_pass: ForwardPass, hidden: Any) -> Any:
        """Write the pass's tokens into the draft's KV cache unless the draft's decodes
        wrote them all; returns the target's hidden states."""
        if forward_pass.is_prompt or not self._wrote_all(forward_pass.seqs):
            self._forward(forward_pass)
            self._caught_up(forward_pass.seqs)
        return hidden

    def _caught_up(self, seqs: list[ScheduledSeq]) -> None:
        """The draft KV holds all tokens of ``seqs`` (profile rows never drafted)."""
        if not self._written:
            return
        req_ids = self.runner.input_batch.req_ids
        for seq in seqs:
            self._written.pop(req_ids[seq.row], None)

    def _wrote_all(self, seqs: list[ScheduledSeq]) -> bool:
        req_ids = self.runner.input_batch.req_ids
        for seq in seqs:
            start, end = self._written.get(req_ids[seq.row], (0, -1))
            if not start <= seq.start < seq.end <= end + 1:
                return False
        return True

    def _first_hidden(self, rows: list[int], first: np.ndarray) -> torch.Tensor | None:
        """What the first decode of each row reads besides its token."""
        return None

    def _pass_starts(self, rows: list[int], first: np.ndarray) -> np.ndarray:
        """Where each row's first pass starts: ``first``, or where the last decodes
        stopped if all drafts were accepted (catching up beats decoding every row)."""
        req_ids = self.runner.input_batch.req_ids
        ends = [self._written.get(req_ids[row], (0, -1))[1] for row in rows]
        starts = np.minimum(first, np.where(np.array(ends) >= 0, ends, first))
        most = self.runner.buckets.config.verify_queries
        assert (first - starts < most).all(), "the draft's KV lags beyond a pass"
        return starts

    def propose(self, num_drafts: int, sampled: list[list[int]]) -> list[list[int]]:
        """Up to ``num_drafts`` greedy drafts per row that sampled tokens."""
        batch = self.runner.input_batch
        rows = [row for row, tokens in enumerate(sampled) if tokens]
        drafts: list[list[int]] = [[] for _ in sampled]
        if not rows or num_drafts == 0:
            self._written = {}
            return drafts
        # Row i's decode j runs at position first[i] + j, reading its last
        # sampled token, then its drafts; each needs a slot within the model.
        first = batch.num_tokens_no_spec[rows] - self.first_decode_offset
        group = self._group()
        tables = [self._block_tables(row) for row in rows]
        limits = np.array(
            [
                min(self.max_model_len, len(t[group]) * self.runner.block_size)
                for t in tables
            ]
        )
        counts = np.clip(limits - first, 0, num_drafts)
        starts = self._pass_starts(rows, first)
        self._written = {}
        if self.decodes_write_target_tokens:
            self._written = {
                batch.req_ids[row]: (int(starts[i]), int(first[i] + counts[i]))
                for i, row in enumerate(rows)
                if counts[i] > 0
            }
        tokens = torch.tensor(
            [sampled[row][-1] for row in rows], device=self.runner.device
        )
        carry = self._first_hidden(rows, first)
        steps: list[torch.Tensor] = []
        for step in range(int(counts.max(initial=0))):
            active = np.flatnonzero(counts > step)
            # Step 0 starts where each row catches up; later steps read one token.
            begin = starts if step == 0 else first + step
            lengths = first[active] + step - begin[active] + 1
            seqs = [
                ScheduledSeq(
                    rows[i],
                    SeqLayout(tables[i][group], int(begin[i]), int(n)),
                    tables[i] if len(tables[i]) > 1 else (),
                )
                for i, n in zip(active, lengths, strict=True)
            ]
            self._decode(seqs, torch.from_numpy(active), tokens, carry)
            steps.append(tokens.clone())
        if steps:
            by_row = torch.stack(steps, dim=1).tolist()
            for i, row in enumerate(rows):
                drafts[row] = by_row[i][: counts[i]]
        return drafts

    def _decode(
        self,
        seqs: list[ScheduledSeq],
        index: torch.Tensor,
        tokens: torch.Tensor,
        carry: torch.Tensor | None,
    ) -> None:
        """One pass of ``seqs``, rows ``index`` of ``tokens`` (and of ``carry``, EAGLE's
        states): each reads its token and leaves the next one greedily there."""
        forward_pass = self._draft_pass(seqs)
        index = index.to(tokens.device)
        last = torch.tensor(forward_pass.last_token_indices, device=tokens.device)
        forward_pass.input_ids[last] = tokens[index]
        hidden_in = None
        if carry is not None:
            hidden_in = carry.new_zeros((forward_pass.num_tokens, carry.shape[1]))
            hidden_in[last] = carry[index]
        hidden, next_carry = self._forward(forward_pass, hidden_in)
        logits = self.model.compute_logits(hidden[last])
        tokens[index] = logits.argmax(dim=-1)
        if carry is not None:
            carry[index] = next_carry[last]

    def _draft_pass(self, seqs: list[ScheduledSeq]) -> ForwardPass:
        """A decode pass, or a verification-shaped one where a row catches up."""
        token_ids = self.runner.input_batch.token_ids_cpu
        buckets = self.runner.buckets
        catching_up = any(seq.layout.num_scheduled_tokens > 1 for seq in seqs)
        queries = buckets.config.verify_queries if catching_up else 1
        return build_decode_pass(seqs, buckets, token_ids, self._cache(), queries)

    def _layer_groups(self) -> dict[str, int]:
        """Each draft layer's KV cache group (a hybrid target's attention group
        is not the first: its state layers' come first)."""
        groups = self.runner.layer_groups
        return {name: groups.get(name, 0) for name in self.layer_names}

    def _group(self) -> int:
        """The KV cache group whose block tables the draft's layers read."""
        groups = set(self._layer_groups().values())
        assert len(groups) == 1, f"draft layers in KV cache groups {groups}"
        return groups.pop()

    def _block_tables(self, row: int) -> tuple[list[int], ...]:
        """The row's block table in every KV cache group."""
        req_id = self.runner.input_batch.req_ids[row]
        return tuple(self.runner.states.requests[req_id].block_ids)

    def _cache(self) -> Any:
        assert self.runner.cache is not None, "initialize_kv_cache() first"
        return self.runner.cache
