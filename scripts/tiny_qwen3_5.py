"""The tiny Qwen3.5 checkpoints build_tiny_models.py writes, from transformers'
own config classes, with the hybrids' sizes (tiny_families.py): three gated
delta-net layers before one gated attention layer, as in Qwen3.5's own 3:1
pattern; the delta-net's projections in Qwen3.5's separate (not interleaved)
layout; partial rotary with interleaved M-RoPE sections; a dense SwiGLU MLP, or
for the MoE four experts of which two per token beside the sigmoid-gated
shared expert. With images: either decoder behind Qwen3.5's vision tower (the
tiny Qwen3-VL's sizes: 16-pixel patches merged 2 x 2, learned positions
interpolated to each grid) and Qwen3-VL's processor.
"""

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from tiny_deepseek import layer_weights
from tiny_families import QWEN3_NEXT_LAYERS, Init, hybrid_shape, save_hybrid
from tiny_qwen2_vl import CHAT_TEMPLATE
from tiny_qwen_vl import (
    QWEN3_MEAN,
    QWEN3_PATCH,
    QWEN3_STD,
    QWEN3_VISION,
    _processor_kwargs,
    _vision_token_ids,
    _vision_tokens,
)
from transformers import (
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen2VLImageProcessor,
    Qwen3_5Config,
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
)
from transformers.models.qwen3_5.modeling_qwen3_5 import (
    Qwen3_5DecoderLayer,
    Qwen3_5RMSNorm,
)
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (
    Qwen3_5MoeDecoderLayer,
)

# Heads of 64 with a quarter of each rotated, as in Qwen3.5: eight rotary
# frequencies, split 3 : 3 : 2 between M-RoPE's time, height and width
# sections (interleaved). A base of 100 keeps the height and width frequencies
# fast enough that an image's rows and columns a few tokens apart differ
# (10^7 in the real models, over 32 frequencies).
QWEN3_5_ATTENTION = {
    "num_key_value_heads": 2,
    "head_dim": 64,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 100.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [3, 3, 2],
        "mrope_interleaved": True,
    },
}
# Two key heads and four value heads of 16 (each key head serves two value
# heads), conv width 4.
QWEN3_5_DELTA_NET = {
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
}


def qwen3_5_text_config(shape: dict[str, Any], moe: bool) -> Any:
    """The decoder of the tiny Qwen3.5 (dense or MoE)."""
    common = {
        **hybrid_shape(shape, QWEN3_NEXT_LAYERS),
        **QWEN3_5_ATTENTION,
        **QWEN3_5_DELTA_NET,
        "dtype": "float32",
    }
    if not moe:
        return Qwen3_5TextConfig(**common)
    hidden = common["hidden_size"]
    return Qwen3_5MoeTextConfig(
        **common,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=hidden // 2,
        shared_expert_intermediate_size=hidden // 2,
    )


def build_qwen3_5(
    shape: dict[str, Any],
    generation_config: GenerationConfig,
    init: Init,
    out_dir: Path,
) -> None:
    """Qwen3.5 dense (Qwen3_5ForCausalLM)."""
    model = Qwen3_5ForCausalLM(qwen3_5_text_config(shape, moe=False))
    save_hybrid(model, generation_config, init, out_dir)


def build_qwen3_5_moe(
    shape: dict[str, Any],
    generation_config: GenerationConfig,
    init: Init,
    out_dir: Path,
) -> None:
    """Qwen3.5 MoE (Qwen3_5MoeForCausalLM)."""
    model = Qwen3_5MoeForCausalLM(qwen3_5_text_config(shape, moe=True))
    save_hybrid(model, generation_config, init, out_dir)


def build_qwen3_5_mtp(
    shape: dict[str, Any],
    generation_config: GenerationConfig,
    init: Init,
    out_dir: Path,
    moe: bool = False,
) -> None:
    """Qwen3.5 (dense, or with ``moe`` its MoE) with one MTP layer, as vLLM's
    Qwen3_5MTP / Qwen3_5MoeMTP load it for ``--speculative-config '{"method":
    "mtp"}'``: ``mtp.*`` tensors beside the model's (transformers drops them
    on load) and ``mtp_num_hidden_layers`` in the config."""
    config = qwen3_5_text_config(shape, moe)
    config.mtp_num_hidden_layers = 1
    model_cls = Qwen3_5MoeForCausalLM if moe else Qwen3_5ForCausalLM
    save_hybrid(model_cls(config), generation_config, init, out_dir)
    weights_file = out_dir / "model.safetensors"
    weights = load_file(str(weights_file))
    save_file(
        {**weights, **mtp_weights(config, moe)},
        str(weights_file),
        metadata={"format": "pt"},
    )


def build_qwen3_5_moe_mtp(
    shape: dict[str, Any],
    generation_config: GenerationConfig,
    init: Init,
    out_dir: Path,
) -> None:
    build_qwen3_5_mtp(shape, generation_config, init, out_dir, moe=True)


def mtp_weights(config: Any, moe: bool) -> dict[str, torch.Tensor]:
    """One MTP layer in Qwen3.5's checkpoint names: ``fc`` over [normed
    embedding of the next token, normed target state], a full-attention
    decoder layer and a final norm (the target's embeddings and LM head are
    shared), drawn from a generator of its own as the target's weights are
    drawn (norms near 1, the rest with std 0.1)."""
    hidden = config.hidden_size
    layer_cls = Qwen3_5MoeDecoderLayer if moe else Qwen3_5DecoderLayer
    mtp = torch.nn.ModuleDict(
        {
            "fc": torch.nn.Linear(2 * hidden, hidden, bias=False),
            "pre_fc_norm_embedding": Qwen3_5RMSNorm(hidden),
            "pre_fc_norm_hidden": Qwen3_5RMSNorm(hidden),
            "layers": torch.nn.ModuleList(
                [layer_cls(config, config.layer_types.index("full_attention"))]
            ),
            "norm": Qwen3_5RMSNorm(hidden),
        }
    )
    generator = torch.Generator().manual_seed(len(config.layer_types) + 1)
    for name, param in mtp.named_parameters():
        noise = torch.randn(param.shape, generator=generator) * 0.1
        param.data.copy_(noise + 1.0 if name.endswith("norm.weight") else noise)
    weights = layer_weights(mtp["layers"][0], "mtp.layers.0.")
    for name, param in mtp.named_parameters():
        if not name.startswith("layers."):
            weights[f"mtp.{name}"] = param.detach().clone()
    return weights


def build_qwen3_5_vl(
    text_shape: dict[str, Any],
    tokenizer: PreTrainedTokenizerFast,
    init: Init,
    out_dir: Path,
    moe: bool = False,
) -> None:
    """Qwen3.5 with images (Qwen3_5ForConditionalGeneration, or with ``moe``
    Qwen3_5MoeForConditionalGeneration); the vision tokens past the text
    vocabulary, as the tiny Qwen3-VL's."""
    vocab_size, ids = _vision_tokens(tokenizer)
    text = qwen3_5_text_config({**text_shape, **ids, "vocab_size": vocab_size}, moe)
    vision = {k: v for k, v in QWEN3_VISION.items() if k != "deepstack_visual_indexes"}
    config_cls = Qwen3_5MoeConfig if moe else Qwen3_5Config
    config = config_cls(
        text_config=text.to_dict(),
        vision_config={**vision, "out_hidden_size": text.hidden_size},
        **_vision_token_ids(tokenizer),
        dtype="float32",
    )
    model_cls = (
        Qwen3_5MoeForConditionalGeneration if moe else Qwen3_5ForConditionalGeneration
    )
    save_hybrid(model_cls(config), GenerationConfig(**ids), init, out_dir)
    common = _processor_kwargs(QWEN3_PATCH, QWEN3_MEAN, QWEN3_STD)
    tokenizer.chat_template = CHAT_TEMPLATE
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(**common),
        video_processor=Qwen3VLVideoProcessor(**common),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(out_dir)


def build_qwen3_5_moe_vl(
    text_shape: dict[str, Any],
    tokenizer: PreTrainedTokenizerFast,
    init: Init,
    out_dir: Path,
) -> None:
    build_qwen3_5_vl(text_shape, tokenizer, init, out_dir, moe=True)


QWEN3_5_BUILDERS = {
    "tiny-qwen3.5": build_qwen3_5,
    "tiny-qwen3.5-moe": build_qwen3_5_moe,
    "tiny-qwen3.5-mtp": build_qwen3_5_mtp,
    "tiny-qwen3.5-moe-mtp": build_qwen3_5_moe_mtp,
}
