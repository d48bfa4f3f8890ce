"""The tiny DeepSeek-V3.2 and DeepSeek-V3 (with its multi-token-prediction
layer) checkpoints build_tiny_models.py writes, made with transformers' own
config classes around tiny-deepseek-v2-moe's latent attention: two layers (a
dense MLP, then four experts of which two per token beside a shared one, with
V3's sigmoid routing and selection bias in two groups of which one is kept).

DeepSeek-V3.2: every layer's indexer (eight heads of 32, rotary on the first
16 dims) keeps each query's 16 best keys: far fewer than the tests' prompts.
DeepSeek-V3: one MTP layer after the two (``model.layers.2``, as DeepSeek
ships it: its own norms, projection and decoder layer, the model's embedding
and LM head copied in), which transformers loads for ``generate(use_mtp=True)``
and vLLM for ``--speculative-config '{"method": "mtp"}'``.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import (
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    DeepseekV32Config,
    DeepseekV32ForCausalLM,
    GenerationConfig,
)

INDEX_TOPK = 16
MLA_SHAPE = {
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 64,
    "q_lora_rank": 96,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    # V3's router as its checkpoints configure it (vLLM reads both names).
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "first_k_dense_replace": 1,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 128,
    "n_group": 2,
    "topk_group": 1,
    "norm_topk_prob": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}
INDEXER_SHAPE = {"index_topk": INDEX_TOPK, "index_n_heads": 8, "index_head_dim": 32}

Init = Callable[[torch.nn.Module], None]


def _config_args(shape: dict[str, Any]) -> dict[str, Any]:
    """The tiny Llama's vocabulary, widths, positions and token ids."""
    kept = ("vocab_size", "hidden_size", "intermediate_size", "initializer_range")
    ids = ("pad_token_id", "bos_token_id", "eos_token_id")
    return {
        **{key: shape[key] for key in (*kept, *ids)},
        "max_position_embeddings": shape["max_position_embeddings"],
        **MLA_SHAPE,
        "dtype": "float32",
    }


def build_deepseek_v32(
    shape: dict[str, Any],
    generation_config: GenerationConfig,
    init: Init,
    out_dir: Path,
) -> None:
    """Sparse MLA in both layers."""
    config = DeepseekV32Config(**_config_args(shape), **INDEXER_SHAPE)
    model = DeepseekV32ForCausalLM(config)
    init(model)
    model.generation_config = generation_config
    model.save_pretrained(out_dir)


def build_deepseek_v3_mtp(
    shape: dict[str, Any],
    generation_config: GenerationConfig,
    init: Init,
    out_dir: Path,
) -> None:
    """Two layers and one MTP layer: a third layer's weights (an MoE layer,
    as V3's is) under ``model.layers.2``, with ``enorm``, ``hnorm``,
    ``eh_proj`` and ``shared_head`` (its norm drawn, its head the model's)."""
    config = DeepseekV3Config(**_config_args(shape), num_nextn_predict_layers=1)
    model = DeepseekV3ForCausalLM(config)
    init(model)
    model.generation_config = generation_config
    model.save_pretrained(out_dir)
    deeper = DeepseekV3ForCausalLM(
        DeepseekV3Config(**{**_config_args(shape), "num_hidden_layers": 3})
    )
    init(deeper)
    _append_mtp_layer(model, deeper, out_dir / "model.safetensors")


def _append_mtp_layer(
    model: torch.nn.Module, deeper: torch.nn.Module, weights_file: Path
) -> None:
    """Add ``deeper``'s third layer as ``model``'s MTP layer to the saved
    weights, in the checkpoint's own (per-expert) names."""
    layer = model.config.num_hidden_layers
    prefix = f"model.layers.{layer}."
    weights = load_file(str(weights_file))
    generator = torch.Generator().manual_seed(layer)
    hidden = model.config.hidden_size
    extra = layer_weights(deeper.model.layers[layer], prefix)
    std = model.config.initializer_range
    extra[prefix + "eh_proj.weight"] = (
        torch.randn(hidden, 2 * hidden, generator=generator) * std
    )
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        noise = torch.randn(hidden, generator=generator) * 0.1
        extra[f"{prefix}{norm}.weight"] = 1.0 + noise
    extra[prefix + "shared_head.head.weight"] = weights["lm_head.weight"].clone()
    extra[prefix + "embed_tokens.weight"] = weights["model.embed_tokens.weight"].clone()
    save_file({**weights, **extra}, str(weights_file), metadata={"format": "pt"})


def layer_weights(source: torch.nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    """A decoder layer's weights with its experts one by one, as DeepSeek's
    and Qwen3.5's checkpoints (and transformers' saved ones) name them."""
    weights: dict[str, torch.Tensor] = {}
    for name, param in source.state_dict().items():
        if ".experts.gate_up_proj" in name:
            for expert, fused in enumerate(param):
                gate, up = fused.chunk(2, dim=0)
                weights[f"{prefix}mlp.experts.{expert}.gate_proj.weight"] = gate.clone()
                weights[f"{prefix}mlp.experts.{expert}.up_proj.weight"] = up.clone()
        elif ".experts.down_proj" in name:
            for expert, down in enumerate(param):
                weights[f"{prefix}mlp.experts.{expert}.down_proj.weight"] = down.clone()
        else:
            weights[prefix + name] = param.detach().clone().contiguous()
    return weights


DEEPSEEK_BUILDERS = {
    "tiny-deepseek-v32": build_deepseek_v32,
    "tiny-deepseek-v3-mtp": build_deepseek_v3_mtp,
}
