"""EAGLE, EAGLE-3 and MTP drafts on the plugin: greedy outputs equal
transformers' (float32), and every step's drafts equal those of a naive head
over the whole sequence (transformers' layers, recomputed from scratch for each
draft), through prefix hits, preemption and chunked prompts. MTP: DeepSeek-V3's
own multi-token-prediction layer (tiny-deepseek-v3-mtp), as transformers loads
it for ``generate(use_mtp=True)``."""

from pathlib import Path
from typing import Any

import pytest
import torch
from models import model_path as model_dir
from safetensors.torch import load_file

from e2e.harness import hf_greedy, vllm_engine, vllm_greedy
from e2e.test_spec_decode import counter, repetitive_prompts

pytestmark = pytest.mark.slow

TARGET = "tiny-llama"
NUM_DRAFTS = 3


class NaiveEagle:
    """The EAGLE-1 recurrence without a KV cache: the state at position p is
    the layer over fc([embedding of token p + 1, target state at p]) for every
    position so far; a draft's state feeds the next draft."""

    @torch.no_grad()
    def __init__(self) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM, LlamaModel

        self.target = AutoModelForCausalLM.from_pretrained(model_dir(TARGET)).eval()
        config = AutoConfig.from_pretrained(model_dir("tiny-llama-eagle"))
        self.head = LlamaModel(config).eval()
        weights = load_file(Path(model_dir("tiny-llama-eagle")) / "model.safetensors")
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


class NaiveDeepseekMTP:
    """vLLM's DeepSeekMTP recurrence without a KV cache, on transformers' own
    MTP layer (``MtpModel``: enorm, hnorm, eh_proj, the decoder layer and
    shared_head.norm as its post-norm; the target's embeddings and LM head):
    the state at position p is the layer over [enorm(embedding of token p +
    1), hnorm(target's last normed state at p)], the embedding zeroed at
    position 0 as vLLM's DeepSeekMTP does; a draft's state feeds the next."""

    TARGET = "tiny-deepseek-v3-mtp"

    @torch.no_grad()
    def __init__(self) -> None:
        from transformers import AutoModelForCausalLM
        from transformers.modeling_layers import MtpModel

        path = model_dir(self.TARGET)
        self.target = AutoModelForCausalLM.from_pretrained(path).eval()
        # MtpModel finds the MTP layer's weights by this pattern (V3's own
        # names layer 61).
        layer = self.target.config.num_hidden_layers
        self.target._keys_to_ignore_on_load_unexpected = [
            rf"model\.layers\.{layer}\..*"
        ]
        self.mtp = MtpModel.from_pretrained(self.target).eval()

    @torch.no_grad()
    def drafts(self, tokens: list[int], count: int) -> list[int]:
        ids = torch.tensor([tokens])
        states = self.target(ids, output_hidden_states=True).hidden_states[-1][0]
        states = states[:-1]  # state p pairs with token p + 1
        next_ids = ids[0, 1:]
        drafts: list[int] = []
        for _ in range(count):
            length = next_ids.shape[0]
            positions = torch.arange(length)[None]
            embeds = self.mtp.embed_tokens(next_ids)[None]
            embeds[:, 0] = 0.0
            mask = torch.full((length, length), float("-inf")).triu(1)[None, None]
            out = self.mtp.layers[0](
                embeds,
                states[None],
                position_embeddings=self.mtp.rotary_emb(embeds, positions),
                attention_mask=mask,
                position_ids=positions,
                past_key_values=None,
            )[0]
            drafts.append(int(self.mtp.shared_head(out[-1]).argmax()))
            states = torch.cat([states, out[-1:]])
            next_ids = torch.cat([next_ids, torch.tensor([drafts[-1]])])
        return drafts


class NaiveEagle3:
    """The EAGLE-3 recurrence without a KV cache: fc over the target's states
    before layer 0 and after layers 0 and 1 (a draft's own pre-norm state
    instead), then the head's layer over [normed embedding of token p + 1,
    normed state], its final norm and LM head."""

    @torch.no_grad()
    def __init__(self) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.models.llama import modeling_llama as llama

        self.target = AutoModelForCausalLM.from_pretrained(model_dir(TARGET)).eval()
        path = model_dir("tiny-llama-eagle3")
        config = AutoConfig.from_pretrained(path)
        config._attn_implementation = "eager"
        w = load_file(Path(path) / "model.safetensors")
        self.w = w
        self.attn = llama.LlamaAttention(config, layer_idx=0).eval()
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            weight = w[f"midlayer.self_attn.{name}.weight"]
            linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
            linear.weight.copy_(weight)
            setattr(self.attn, name, linear)
        self.rotary = llama.LlamaRotaryEmbedding(config)
        self.eps = config.rms_norm_eps
        self.aux_layers = config.eagle_aux_hidden_state_layer_ids

    def norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + self.eps) * self.w[name]

    def layer(self, embeds: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """The head's pre-norm output state at every position."""
        w, length = self.w, states.shape[0]
        x = torch.cat(
            [
                self.norm(embeds, "midlayer.input_layernorm.weight"),
                self.norm(states, "midlayer.hidden_norm.weight"),
            ],
            dim=-1,
        )[None]
        positions = torch.arange(length)[None]
        mask = torch.full((length, length), float("-inf")).triu(1)[None, None]
        attn, _ = self.attn(x, self.rotary(x, positions), mask)
        residual = states + attn[0]
        mlp_in = self.norm(residual, "midlayer.post_attention_layernorm.weight")
        gate = torch.nn.functional.silu(mlp_in @ w["midlayer.mlp.gate_proj.weight"].T)
        up = mlp_in @ w["midlayer.mlp.up_proj.weight"].T
        return residual + (gate * up) @ w["midlayer.mlp.down_proj.weight"].T

    def aux_states(self, ids: torch.Tensor) -> torch.Tensor:
        """The target's states before layer 0 and after each layer, pre-norm."""
        captured: list[torch.Tensor] = []
        model = self.target.model
        hooks = [
            model.embed_tokens.register_forward_hook(
                lambda m, i, o: captured.append(o[0])
            )
        ]
        for layer in model.layers:
            hooks.append(
                layer.register_forward_hook(
                    lambda m, i, o: captured.append(
                        (o[0] if isinstance(o, tuple) else o)[0]
                    )
                )
            )
        self.target(ids)
        for hook in hooks:
            hook.remove()
        return torch.cat([captured[i] for i in self.aux_layers], dim=-1)

    @torch.no_grad()
    def drafts(self, tokens: list[int], count: int) -> list[int]:
        ids = torch.tensor([tokens])
        states = (self.aux_states(ids) @ self.w["fc.weight"].T)[:-1]
        embed = self.target.get_input_embeddings()
        next_ids = ids[0, 1:]
        drafts: list[int] = []
        for _ in range(count):
            out = self.layer(embed(next_ids), states)
            logits = self.norm(out[-1], "norm.weight") @ self.w["lm_head.weight"].T
            drafts.append(int(logits.argmax()))
            states = torch.cat([states, out[-1:]])
            next_ids = torch.cat([next_ids, torch.tensor([drafts[-1]])])
        return drafts


def record_drafts(monkeypatch) -> list[tuple[list[int], list[int]]]:
    """(tokens so far, drafts proposed after them) of every row and step."""
    from vllm_hpu.worker.spec_decode.decoder import SpecDecoder

    records: list[tuple[list[int], list[int]]] = []
    propose = SpecDecoder.propose

    def recording(self, scheduler_output, sampled):
        propose(self, scheduler_output, sampled)
        records.extend(proposed(self))

    monkeypatch.setattr(SpecDecoder, "propose", recording)
    return records


def proposed(decoder: Any) -> list[tuple[list[int], list[int]]]:
    """(tokens so far, drafts) of each row the decoder's last proposal drafted for."""
    batch = decoder.input_batch
    return [
        (batch.token_ids_cpu[row, : batch.num_tokens_no_spec[row]].tolist(), drafts)
        for row, drafts in enumerate(decoder._drafts.draft_token_ids)
        if drafts
    ]


@pytest.mark.parametrize(
    ("method", "target", "head", "naive_head"),
    [
        ("eagle", TARGET, "tiny-llama-eagle", NaiveEagle),
        ("eagle3", TARGET, "tiny-llama-eagle3", NaiveEagle3),
        # The target's own layer: no head model.
        ("mtp", NaiveDeepseekMTP.TARGET, None, NaiveDeepseekMTP),
    ],
)
def test_drafts_equal_a_naive_head_and_greedy_matches_hf(
    monkeypatch, method, target, head, naive_head
):
    prompts = repetitive_prompts()
    expected = hf_greedy(model_dir(target), prompts, 24, torch.float32)
    records = record_drafts(monkeypatch)
    config = {"method": method, **({"model": model_dir(head)} if head else {})}
    with vllm_engine(
        model_dir(target),
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
    naive = naive_head()
    # Every step's drafts, recomputed naively.
    assert len(records) >= 40
    for tokens, drafts in records:
        assert drafts == naive.drafts(tokens, len(drafts)), len(tokens)
