"""EAGLE drafts on the plugin: greedy outputs equal transformers' (float32), and
every step's drafts equal those of a naive EAGLE head over the whole sequence
(transformers' Llama layer, recomputed from scratch for each draft), through
prefix hits, preemption and chunked prompts."""

from pathlib import Path

import pytest
import torch
from models import model_path as model_dir
from safetensors.torch import load_file

from e2e.harness import hf_greedy, vllm_engine, vllm_greedy
from e2e.test_spec_decode import counter, repetitive_prompts

pytestmark = pytest.mark.slow

TARGET, HEAD = "tiny-llama", "tiny-llama-eagle"
NUM_DRAFTS = 3


class NaiveEagle:
    """The EAGLE-1 recurrence without a KV cache: the state at position p is
    the layer over fc([embedding of token p + 1, target state at p]) for every
    position so far; a draft's state feeds the next draft."""

    @torch.no_grad()
    def __init__(self) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM, LlamaModel

        self.target = AutoModelForCausalLM.from_pretrained(model_dir(TARGET)).eval()
        config = AutoConfig.from_pretrained(model_dir(HEAD))
        self.head = LlamaModel(config).eval()
        weights = load_file(Path(model_dir(HEAD)) / "model.safetensors")
        self.fc = weights.pop("fc.weight")
        missing = self.head.load_state_dict(weights, strict=False).missing_keys
        assert set(missing) == {
            "embed_tokens.weight",
            "layers.0.input_layernorm.weight",
            "norm.weight",
        }
        self.head.layers[0].input_layernorm = torch.nn.Identity()
        self.head.norm = torch.nn.Identity()

    @torch.no_grad()
    def drafts(self, tokens: list[int], count: int) -> list[int]:
        """``count`` greedy drafts after ``tokens``."""
        ids = torch.tensor([tokens])
        target = self.target(ids, output_hidden_states=True).hidden_states[-1][0]
        embed = self.target.get_input_embeddings()
        states = target[:-1]  # state p pairs with token p + 1
        next_ids = ids[0, 1:]
        drafts: list[int] = []
        for _ in range(count):
            inputs = torch.cat([embed(next_ids), states], dim=-1) @ self.fc.T
            out = self.head(inputs_embeds=inputs[None]).last_hidden_state[0]
            draft = int(self.target.lm_head(out[-1]).argmax())
            drafts.append(draft)
            states = torch.cat([states, out[-1:]])
            next_ids = torch.cat([next_ids, torch.tensor([draft])])
        return drafts


def record_drafts(monkeypatch) -> list[tuple[list[int], list[int]]]:
    """(tokens so far, drafts proposed after them) of every row and step."""
    from vllm_hpu.worker.spec_decode import SpecDecoder

    records: list[tuple[list[int], list[int]]] = []
    propose = SpecDecoder.propose

    def recording(self, scheduler_output, sampled):
        propose(self, scheduler_output, sampled)
        batch = self.input_batch
        for row, drafts in enumerate(self._drafts.draft_token_ids):
            if drafts:
                end = batch.num_tokens_no_spec[row]
                records.append((batch.token_ids_cpu[row, :end].tolist(), drafts))

    monkeypatch.setattr(SpecDecoder, "propose", recording)
    return records


def test_eagle_drafts_equal_a_naive_head_and_greedy_matches_hf(monkeypatch):
    prompts = repetitive_prompts()
    expected = hf_greedy(model_dir(TARGET), prompts, 24, torch.float32)
    records = record_drafts(monkeypatch)
    config = {"method": "eagle", "model": model_dir(HEAD)}
    with vllm_engine(
        model_dir(TARGET),
        block_size=16,
        max_model_len=256,
        num_gpu_blocks_override=20,
        kv_cache_memory_bytes=None,
        max_num_batched_tokens=48,
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
        speculative_config={**config, "num_speculative_tokens": NUM_DRAFTS},
    ) as llm:
        assert vllm_greedy(llm, prompts, 24) == expected
        assert counter(llm, "vllm:spec_decode_num_draft_tokens") > 0
        assert counter(llm, "vllm:num_preemptions") > 0
        assert counter(llm, "vllm:prefix_cache_hits") > 0
    naive = NaiveEagle()
    # Every step's drafts, recomputed naively.
    assert len(records) >= 40
    for tokens, drafts in records:
        assert drafts == naive.drafts(tokens, len(drafts)), len(tokens)
