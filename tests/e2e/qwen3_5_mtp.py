"""A naive reference for Qwen3.5's MTP drafts: vLLM's Qwen3_5MTP recurrence
without a KV cache, on transformers' own Qwen3.5 modules (transformers drops
the ``mtp.*`` tensors, so its layer is built here from them)."""

from pathlib import Path

import torch
from models import model_path
from safetensors.torch import load_file

MTP = "mtp."
EXPERTS = "mlp.experts."


class NaiveQwen3_5MTP:
    """The state at position p is the MTP layer (a full-attention decoder
    layer of the target's kind, causal over positions 0..p) over
    fc([pre_fc_norm_embedding(embedding of token p + 1),
    pre_fc_norm_hidden(target's last normed state at p)]), then ``norm``; the
    target's LM head drafts from it, and a draft's state feeds the next."""

    @torch.no_grad()
    def __init__(self, name: str) -> None:
        from transformers import AutoModelForCausalLM

        self.target = AutoModelForCausalLM.from_pretrained(model_path(name)).eval()
        config = self.target.config
        config._attn_implementation = "eager"
        decoder = self.target.model
        attention = config.layer_types.index("full_attention")
        self.layer = type(decoder.layers[attention])(config, attention).eval()
        self.norms = {
            part: type(decoder.norm)(config.hidden_size, eps=config.rms_norm_eps)
            for part in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")
        }
        weights = load_file(Path(model_path(name)) / "model.safetensors")
        mtp = {k[len(MTP) :]: v for k, v in weights.items() if k.startswith(MTP)}
        self.fc = mtp.pop("fc.weight")
        for part, norm in self.norms.items():
            norm.weight.copy_(mtp.pop(f"{part}.weight"))
        layer = {k[len("layers.0.") :]: v for k, v in mtp.items()}
        self.layer.load_state_dict(fused_experts(layer), strict=True)
        # Whole sequences and the target's states over them: a causal model's
        # states over a prefix are the prefix of these (know()).
        self.known: list[tuple[list[int], torch.Tensor]] = []

    @torch.no_grad()
    def know(self, sequences: list[list[int]]) -> None:
        """Run the target once over each of ``sequences`` (the prompts and
        their generations): drafts after any prefix of them read its states."""
        for tokens in sequences:
            states = self.target.model(torch.tensor([tokens])).last_hidden_state[0]
            self.known.append((tokens, states))

    def target_states(self, tokens: list[int]) -> torch.Tensor:
        for sequence, states in self.known:
            if sequence[: len(tokens)] == tokens:
                return states[: len(tokens)]
        return self.target.model(torch.tensor([tokens])).last_hidden_state[0]

    @torch.no_grad()
    def drafts(self, tokens: list[int], count: int) -> list[int]:
        ids = torch.tensor([tokens])
        states = self.target_states(tokens)[:-1]
        next_ids = ids[0, 1:]
        embed = self.target.get_input_embeddings()
        drafts: list[int] = []
        for _ in range(count):
            inputs = torch.cat(
                [
                    self.norms["pre_fc_norm_embedding"](embed(next_ids)),
                    self.norms["pre_fc_norm_hidden"](states),
                ],
                dim=-1,
            )
            out = self.norms["norm"](self.layer_over(inputs @ self.fc.T))
            drafts.append(int(self.target.lm_head(out[-1]).argmax()))
            states = torch.cat([states, out[-1:]])
            next_ids = torch.cat([next_ids, torch.tensor([drafts[-1]])])
        return drafts

    def layer_over(self, x: torch.Tensor) -> torch.Tensor:
        """The decoder layer, causal, at text positions 0..n-1 (M-RoPE's three
        sections all read the text position)."""
        length = x.shape[0]
        positions = torch.arange(length)[None]
        mask = torch.full((length, length), float("-inf")).triu(1)[None, None]
        rotary = self.target.model.rotary_emb(x[None], positions)
        out = self.layer(
            x[None],
            position_embeddings=rotary,
            attention_mask=mask,
            position_ids=positions,
        )
        return (out[0] if isinstance(out, tuple) else out)[0]


def fused_experts(layer: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A layer's weights with its experts one by one (the checkpoint's names)
    fused as transformers holds them (``mlp.experts.gate_up_proj``, ``down_proj``)."""
    fused = {k: v for k, v in layer.items() if not k.startswith(EXPERTS)}
    count = sum(k.startswith(EXPERTS) for k in layer) // 3
    if count == 0:
        return fused

    def expert(i: int, proj: str) -> torch.Tensor:
        return layer[f"{EXPERTS}{i}.{proj}.weight"]

    fused[EXPERTS + "gate_up_proj"] = torch.stack(
        [
            torch.cat([expert(i, "gate_proj"), expert(i, "up_proj")])
            for i in range(count)
        ]
    )
    fused[EXPERTS + "down_proj"] = torch.stack(
        [expert(i, "down_proj") for i in range(count)]
    )
    return fused
