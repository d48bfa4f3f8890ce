"""Build tiny random-weight Hugging Face checkpoints for tests and benchmarks.

Usage: build_tiny_models.py OUT_DIR. Deterministic (same bytes on every run), no
network, a few seconds; a model is rebuilt only when BUILD_VERSION changes.
"""

import json
import random
import shutil
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from tokenizers.trainers import BpeTrainer

from vllm_hpu.patches.torchvision_import import allow_torchvision_import

# transformers imports torchvision once it is installed (see that patch).
allow_torchvision_import()
from tiny_deepseek import DEEPSEEK_BUILDERS  # noqa: E402  (beside this script)
from tiny_families import FAMILY_BUILDERS  # noqa: E402
from tiny_gemma3 import build_gemma3  # noqa: E402
from tiny_gemma4 import GEMMA4_BUILDERS, build_gemma4_vl  # noqa: E402
from tiny_llama4_vision import build_llama4_vision  # noqa: E402
from tiny_multimodal import build_llava, build_mistral3  # noqa: E402
from tiny_mxfp4 import write_gpt_oss_mxfp4  # noqa: E402
from tiny_nemotron_h import NEMOTRON_H_BUILDERS  # noqa: E402
from tiny_qwen2_vl import build_qwen2_vl  # noqa: E402
from tiny_qwen3_5 import (  # noqa: E402
    QWEN3_5_BUILDERS,
    build_qwen3_5_moe_vl,
    build_qwen3_5_vl,
)
from tiny_qwen_vl import build_qwen2_5_vl, build_qwen3_vl  # noqa: E402
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    GenerationConfig,
    PreTrainedTokenizerFast,
)
from transformers.utils import logging as hf_logging  # noqa: E402

# Bump whenever anything below changes what gets written.
BUILD_VERSION = "1"
STAMP_FILE = ".build_version"
SEED = 1234

# Exactly a multiple of 64 so that the embedding has no rows the tokenizer cannot
# decode (a randomly initialised model would otherwise sample them).
VOCAB_SIZE = 1024
HIDDEN_SIZE = 256
INTERMEDIATE_SIZE = 512
NUM_LAYERS = 2
# head_dim 64 is supported by every attention backend; heads, kv heads and the
# vocabulary all divide by 2 so that tensor-parallel tests can shard them.
NUM_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = HIDDEN_SIZE // NUM_HEADS
MAX_POSITIONS = 2048

# The default 0.02 gives near-uniform logits and one token repeated forever; this
# gives logits with a spread of a few units and varied greedy continuations.
WEIGHT_STD = 0.1
NORM_STD = 0.1
BIAS_STD = 0.02

PAD, BOS, EOS, IM_START, IM_END = (
    "<|pad|>",
    "<|bos|>",
    "<|eos|>",
    "<|im_start|>",
    "<|im_end|>",
)
SPECIAL_TOKENS = [PAD, BOS, EOS, IM_START, IM_END]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

GQA_SHAPE = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": HIDDEN_SIZE,
    "intermediate_size": INTERMEDIATE_SIZE,
    "num_hidden_layers": NUM_LAYERS,
    "num_attention_heads": NUM_HEADS,
    "num_key_value_heads": NUM_KV_HEADS,
    "head_dim": HEAD_DIM,
    "max_position_embeddings": MAX_POSITIONS,
    "initializer_range": WEIGHT_STD,
}
# model name -> (model_type, config arguments beyond the special token ids)
MODEL_SPECS = {
    "tiny-llama": ("llama", GQA_SHAPE),
    # Tied embeddings, as in the small Qwen2.5 checkpoints.
    "tiny-qwen2": ("qwen2", {**GQA_SHAPE, "tie_word_embeddings": True}),
    "tiny-qwen3": ("qwen3", GQA_SHAPE),
    "tiny-mistral": ("mistral", {**GQA_SHAPE, "sliding_window": None}),
    "tiny-opt": (
        "opt",
        {
            "vocab_size": VOCAB_SIZE,
            "hidden_size": HIDDEN_SIZE,
            "word_embed_proj_dim": HIDDEN_SIZE,
            "ffn_dim": INTERMEDIATE_SIZE,
            "num_hidden_layers": NUM_LAYERS,
            "num_attention_heads": NUM_HEADS,
            "max_position_embeddings": MAX_POSITIONS,
            "init_std": WEIGHT_STD,
        },
    ),
    "tiny-gpt2": (
        "gpt2",
        {
            "vocab_size": VOCAB_SIZE,
            "n_embd": HIDDEN_SIZE,
            "n_inner": INTERMEDIATE_SIZE,
            "n_layer": NUM_LAYERS,
            "n_head": NUM_HEADS,
            "n_positions": MAX_POSITIONS,
            "initializer_range": WEIGHT_STD,
        },
    ),
}

# Mixture-of-experts models: 4 or 8 experts, top-2, expert sizes that divide by 2 for
# tensor parallelism. Qwen2-MoE has a gated shared expert and keeps the top-k
# weights as they are; Qwen3-MoE renormalises them, as Mixtral does.
NUM_EXPERTS = 4
NUM_EXPERTS_PER_TOK = 2
MOE_INTERMEDIATE_SIZE = 128
MOE_SPECS = {
    "tiny-mixtral": (
        "mixtral",
        {
            **GQA_SHAPE,
            "intermediate_size": MOE_INTERMEDIATE_SIZE,
            "num_local_experts": NUM_EXPERTS,
            "num_experts_per_tok": NUM_EXPERTS_PER_TOK,
            "sliding_window": None,
        },
    ),
    "tiny-qwen2-moe": (
        "qwen2_moe",
        {
            **GQA_SHAPE,
            "moe_intermediate_size": MOE_INTERMEDIATE_SIZE,
            "shared_expert_intermediate_size": INTERMEDIATE_SIZE,
            "num_experts": NUM_EXPERTS,
            "num_experts_per_tok": NUM_EXPERTS_PER_TOK,
            "norm_topk_prob": False,
        },
    ),
    "tiny-qwen3-moe": (
        "qwen3_moe",
        {
            **GQA_SHAPE,
            "moe_intermediate_size": MOE_INTERMEDIATE_SIZE,
            "num_experts": 2 * NUM_EXPERTS,
            "num_experts_per_tok": NUM_EXPERTS_PER_TOK,
            "norm_topk_prob": True,
        },
    ),
    # DeepSeek-V3's routing without its MLA attention: sigmoid scores, a selection
    # bias, 2 groups of which 1 is kept, a routed scale and a shared expert; the
    # first layer stays dense.
    "tiny-glm4-moe": (
        "glm4_moe",
        {
            **GQA_SHAPE,
            "moe_intermediate_size": MOE_INTERMEDIATE_SIZE,
            "n_routed_experts": 2 * NUM_EXPERTS,
            "num_experts_per_tok": NUM_EXPERTS_PER_TOK,
            "n_group": 2,
            "topk_group": 1,
            "n_shared_experts": 1,
            "routed_scaling_factor": 2.5,
            "first_k_dense_replace": 1,
        },
    ),
}
MODEL_SPECS.update(MOE_SPECS)

# DeepSeek-V2-style multi-head latent attention (MLA): a small latent
# (kv_lora_rank) cached per token plus a shared rotary key part. Default rope
# (no yarn) so that vLLM and transformers rotate alike. first_k_dense_replace
# = NUM_LAYERS keeps every MLP dense; the "-moe" variant routes layer 1 through
# experts with a shared expert (V2's softmax top-k, no renormalisation) and
# projects the query through a low-rank q_lora_rank as DeepSeek-V3 does.
MLA_SHAPE = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": HIDDEN_SIZE,
    "intermediate_size": INTERMEDIATE_SIZE,
    "num_hidden_layers": NUM_LAYERS,
    "num_attention_heads": NUM_HEADS,
    "num_key_value_heads": NUM_HEADS,
    "kv_lora_rank": 64,
    "q_lora_rank": None,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "first_k_dense_replace": NUM_LAYERS,
    "max_position_embeddings": MAX_POSITIONS,
    "initializer_range": WEIGHT_STD,
}
MLA_SPECS = {
    "tiny-deepseek-v2": ("deepseek_v2", MLA_SHAPE),
    "tiny-deepseek-v2-moe": (
        "deepseek_v2",
        {
            **MLA_SHAPE,
            "q_lora_rank": 96,
            "first_k_dense_replace": 1,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "moe_intermediate_size": 128,
            "topk_method": "greedy",
            # vLLM always routes DeepSeek through grouped top-k: one group of all.
            "n_group": 1,
            "topk_group": 1,
            "norm_topk_prob": False,
        },
    ),
}
# DeepSeek-V2/V3's real head widths: a 192-wide query and key head (128 without
# rotary, 64 rotary), values 128 wide.
MLA_SPECS["tiny-deepseek-v2-q192"] = (
    "deepseek_v2",
    {**MLA_SHAPE, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128},
)
# DeepSeek-V3's block-FP8 layout wants every width in whole 128-wide blocks
# (vLLM checks the parts of a fused projection): the tests write all of this
# one's decoder linears, MLA, dense, shared and routed experts, in 128 x 128
# blocks (tests/e2e/test_deepseek_fp8.py).
MLA_SPECS["tiny-deepseek-v2-moe-128"] = (
    "deepseek_v2",
    {
        **MLA_SPECS["tiny-deepseek-v2-moe"][1],
        "q_lora_rank": 128,
        "kv_lora_rank": 128,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 64,
        "v_head_dim": 64,
    },
)
MODEL_SPECS.update(MLA_SPECS)

# Attention variants (sliding windows, soft-capping, ALiBi, small heads), each
# checked against transformers end to end. Windows are far shorter than the
# test prompts so that they bind, and not multiples of 16-token blocks.
WINDOW = 40
VARIANT_SPECS = {
    "tiny-mistral-sw": ("mistral", {**GQA_SHAPE, "sliding_window": 32}),
    "tiny-phi3-sw": (
        "phi3",
        {
            **GQA_SHAPE,
            "sliding_window": WINDOW,
            "original_max_position_embeddings": MAX_POSITIONS,
        },
    ),
    # Alternate windowed and global layers; a soft-cap low enough to bind.
    "tiny-gemma2": (
        "gemma2",
        {
            **GQA_SHAPE,
            "query_pre_attn_scalar": HEAD_DIM,
            "sliding_window": WINDOW,
            "attn_logit_softcapping": 30.0,
            "final_logit_softcapping": 30.0,
        },
    ),
    "tiny-bloom": (
        "bloom",
        {
            "vocab_size": VOCAB_SIZE,
            "hidden_size": HIDDEN_SIZE,
            "n_layer": NUM_LAYERS,
            "n_head": NUM_HEADS,
            "initializer_range": WEIGHT_STD,
        },
    ),
    # Falcon-RW's layout: ALiBi instead of rotary embeddings.
    "tiny-falcon-alibi": (
        "falcon",
        {
            "vocab_size": VOCAB_SIZE,
            "hidden_size": HIDDEN_SIZE,
            "num_hidden_layers": NUM_LAYERS,
            "num_attention_heads": NUM_HEADS,
            "alibi": True,
            "bias": True,
            "multi_query": False,
            "parallel_attn": False,
            "new_decoder_architecture": False,
            "max_position_embeddings": MAX_POSITIONS,
            "initializer_range": WEIGHT_STD,
        },
    ),
    "tiny-llama-h32": (
        "llama",
        {
            **GQA_SHAPE,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 32,
        },
    ),
    "tiny-llama-h40": ("llama", {**GQA_SHAPE, "head_dim": 40}),
}
MODEL_SPECS.update(VARIANT_SPECS)

# ---- Long context (issue 38) -------------------------------------------------
# 131072 positions with each family's rope scaling, as its long checkpoints ship
# (Llama 3.1's llama3, Qwen2.5's YaRN, Phi-3's LongRoPE). One layer and one head
# of 64 (the fused kernel's smallest size), so that attention over a 100k-token
# prompt stays affordable on a CPU, in transformers as in the plugin.
LONG_CONTEXT = 131072
LONG_HEAD_DIM = 64
LONG_SHAPE = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": LONG_HEAD_DIM,
    "intermediate_size": 2 * LONG_HEAD_DIM,
    "num_hidden_layers": 1,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "max_position_embeddings": LONG_CONTEXT,
    "initializer_range": WEIGHT_STD,
}
LONG_CONTEXT_SPECS = {
    "tiny-llama3-128k": (
        "llama",
        {
            **LONG_SHAPE,
            "rope_parameters": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": LONG_CONTEXT // 8,
                "rope_theta": 500000.0,
            },
        },
    ),
    "tiny-qwen2-yarn-128k": (
        "qwen2",
        {
            **LONG_SHAPE,
            "tie_word_embeddings": True,
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 8.0,
                "original_max_position_embeddings": LONG_CONTEXT // 8,
                "rope_theta": 1000000.0,
            },
        },
    ),
    "tiny-phi3-longrope-128k": (
        "phi3",
        {
            **LONG_SHAPE,
            "sliding_window": None,
            "original_max_position_embeddings": 4096,
            "rope_parameters": {
                "rope_type": "longrope",
                # Per rotary pair: short near 1, long growing to 32 (Phi-3's shape).
                "short_factor": [1.0 + i / 256 for i in range(LONG_HEAD_DIM // 2)],
                "long_factor": [1.0 + i for i in range(LONG_HEAD_DIM // 2)],
                "rope_theta": 10000.0,
            },
        },
    ),
}
MODEL_SPECS.update(LONG_CONTEXT_SPECS)

# Norm weights other than ~1, per (model, part of the norm's module name; "" for
# every norm). With tied embeddings the current token's own embedding can drown
# the layers, and every continuation repeats one token: Gemma scales embeddings
# by sqrt(hidden_size) (larger norms, which also make its soft-cap bind), Bloom
# normalises them right away (an embedding norm with weights around 0). The long
# context models' attention inputs are three times wider, so that a query picks
# few keys out of 100k: near-uniform weights would hide a wrong key or position.
NORM_MEANS = {
    ("tiny-gemma2", ""): 9.0,
    ("tiny-bloom", "word_embeddings_layernorm"): 0.0,
    **{(name, "input_layernorm"): 3.0 for name in LONG_CONTEXT_SPECS},
}

# ---- Pooling models (issue 18) ----------------------------------------------
# A sequence-classification head on the tiny Llama: vLLM runs it as
# LlamaForSequenceClassification (LLM.classify) with last-token pooling.
NUM_LABELS = 3
SEQUENCE_CLASSIFIERS = {
    "tiny-llama-classify": ("llama", {**GQA_SHAPE, "num_labels": NUM_LABELS}),
}
MODEL_SPECS.update(SEQUENCE_CLASSIFIERS)

# ---- Multimodal models (issue 25) -------------------------------------------
# LLaVA-1.5 style around the tiny Llama (scripts/tiny_multimodal.py), and
# Qwen2-VL with M-RoPE (scripts/tiny_qwen2_vl.py), Qwen2.5-VL and Qwen3-VL
# (scripts/tiny_qwen_vl.py), Qwen3.5 and its MoE (scripts/tiny_qwen3_5.py),
# Mistral 3 (scripts/tiny_multimodal.py) and Gemma 3
# (scripts/tiny_gemma3.py), Llama 4 with its tiled vision tower
# (scripts/tiny_llama4_vision.py) and Gemma 4 (scripts/tiny_gemma4.py); each
# written with its processor and chat template.
MULTIMODAL_MODELS = {
    "tiny-llava": ("llava", GQA_SHAPE),
    "tiny-qwen2-vl": ("qwen2_vl", GQA_SHAPE),
    "tiny-qwen2.5-vl": ("qwen2_5_vl", GQA_SHAPE),
    "tiny-qwen3-vl": ("qwen3_vl", GQA_SHAPE),
    "tiny-mistral3": ("mistral3", GQA_SHAPE),
    "tiny-gemma3": ("gemma3", GQA_SHAPE),
    "tiny-llama4-vision": ("llama4", GQA_SHAPE),
    "tiny-qwen3.5-vl": ("qwen3_5", GQA_SHAPE),
    "tiny-qwen3.5-moe-vl": ("qwen3_5_moe", GQA_SHAPE),
    "tiny-gemma4-vl": ("gemma4", GQA_SHAPE),
}
MULTIMODAL_BUILDERS = {
    "llava": build_llava,
    "qwen2_vl": build_qwen2_vl,
    "qwen2_5_vl": build_qwen2_5_vl,
    "qwen3_vl": build_qwen3_vl,
    "mistral3": build_mistral3,
    "gemma3": build_gemma3,
    "llama4": build_llama4_vision,
    "qwen3_5": build_qwen3_5_vl,
    "qwen3_5_moe": build_qwen3_5_moe_vl,
    "gemma4": build_gemma4_vl,
}
MODEL_SPECS.update(MULTIMODAL_MODELS)

# ---- Model families (issue 33) -----------------------------------------------
# gpt-oss and Llama 4 (text), built with their own config classes
# (scripts/tiny_families.py) around the tiny Llama's sizes; DeepSeek-V3.2's
# sparse attention and DeepSeek-V3's MTP layer (scripts/tiny_deepseek.py).
FAMILY_MODEL_BUILDERS = (
    FAMILY_BUILDERS
    | DEEPSEEK_BUILDERS
    | QWEN3_5_BUILDERS
    | NEMOTRON_H_BUILDERS
    | GEMMA4_BUILDERS
)
FAMILY_MODELS = {name: ("", GQA_SHAPE) for name in FAMILY_MODEL_BUILDERS}
MODEL_SPECS.update(FAMILY_MODELS)
# gpt-oss as OpenAI ships it: tiny-gpt-oss's weights, its experts in MXFP4
# (scripts/tiny_mxfp4.py).
MXFP4_MODELS = {"tiny-gpt-oss-mxfp4": "tiny-gpt-oss"}
MODEL_SPECS.update({name: FAMILY_MODELS[base] for name, base in MXFP4_MODELS.items()})

# ---- Draft models for speculative decoding (issue 23) ------------------------
# The first layer of a target, with its embeddings, final norm and LM head: a
# smaller model sharing the target's tokenizer whose greedy choice often, but
# not always, agrees with the target's (drafts accepted and rejected).
DRAFT_MODELS = {"tiny-llama-draft": ("tiny-llama", 1)}
# An EAGLE-1 head for a target, in the layout vLLM loads for method "eagle"
# (EagleLlamaForCausalLM): one decoder layer without its input norm, and "fc"
# over [token embedding, target hidden state]; no embeddings and no LM head,
# so vLLM shares the target's.
EAGLE_HEADS = {"tiny-llama-eagle": "tiny-llama"}
# An EAGLE-3 head, as vLLM loads one for method "eagle3"
# (Eagle3LlamaForCausalLM): "midlayer" over [normed embedding, normed fc of
# the target's states before layer 0, after layer 1 and after layer 2], its
# own final norm and LM head over the whole vocabulary; the target's
# embeddings.
EAGLE3_HEADS = {"tiny-llama-eagle3": "tiny-llama"}
EAGLE3_AUX_LAYERS = [0, 1, 2]
MODEL_SPECS.update(
    {
        draft: (
            MODEL_SPECS[target][0],
            {**MODEL_SPECS[target][1], "num_hidden_layers": layers},
        )
        for draft, (target, layers) in {
            **DRAFT_MODELS,
            **{
                head: (target, 1)
                for head, target in {**EAGLE_HEADS, **EAGLE3_HEADS}.items()
            },
        }.items()
    }
)
# ------------------------------------------------------------------------------

PASSAGES = [
    "The capital of France is Paris. The capital of Italy is Rome. "
    "The capital of Japan is Tokyo, and the capital of Spain is Madrid.",
    "Once upon a time, a small robot lived in a quiet village by the sea. "
    "Every morning it walked to the harbour to count the boats.",
    "Water boils at one hundred degrees Celsius at sea level. "
    "Ice melts when the temperature rises above zero degrees.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "Question: What is two plus three? Answer: Two plus three is five.",
    "The quick brown fox jumps over the lazy dog; the dog does not mind.",
    "Hello! How are you today? I am fine, thank you. What would you like to do?",
    "Large language models predict the next token from the tokens before it. "
    "A cache keeps the keys and values of earlier tokens for later steps.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 256 1024 2048 3.14 42.",
]
SUBJECTS = [
    "the teacher", "a farmer", "my brother", "the old man", "a young girl",
    "the computer", "our team", "the cat", "a scientist", "the city",
    "the river", "this program", "every student", "the doctor", "a bird",
]  # fmt: skip
VERBS = [
    "reads", "writes", "builds", "finds", "carries", "watches", "opens",
    "paints", "follows", "remembers", "explains", "changes", "measures",
    "collects", "describes", "answers", "travels to", "looks at",
]  # fmt: skip
OBJECTS = [
    "a long letter", "the green garden", "an interesting story", "the market",
    "a heavy stone", "the northern mountains", "a simple question", "the window",
    "three yellow flowers", "the morning train", "a wooden table", "the library",
    "seven silver coins", "the winter forest", "a beautiful song", "the bridge",
    "the number of planets", "a difficult problem", "the evening news",
]  # fmt: skip
ENDINGS = [
    "", " before breakfast", " after the rain", " with great care",
    " every Sunday", " in the afternoon", " because it is important",
    " while everyone is sleeping", " during the summer holidays",
]  # fmt: skip
ADJECTIVES = [
    "small", "bright", "ancient", "careful", "famous", "gentle", "hungry",
    "modern", "narrow", "patient", "quiet", "rapid", "strange", "thirsty",
    "useful", "wonderful", "cheerful", "dangerous", "friendly", "golden",
    "honest", "important", "magnificent", "nervous", "ordinary", "powerful",
    "mysterious", "delicious", "electric", "frozen", "invisible", "musical",
]  # fmt: skip
PLACES = [
    "London", "Berlin", "Cairo", "Sydney", "Toronto", "Chicago", "Lisbon",
    "Vienna", "Mexico", "Brazil", "Canada", "Germany", "Egypt", "India",
    "Norway", "Kenya", "Peru", "Greece", "Sweden", "Portugal", "Australia",
]  # fmt: skip
NOUNS = [
    "kitchen", "journey", "keyboard", "machine", "pencil", "umbrella", "village",
    "harbour", "engine", "planet", "orchestra", "language", "message", "network",
    "picture", "question", "science", "weather", "history", "festival",
    "elephant", "butterfly", "mountain", "telephone", "hospital", "airport",
    "chocolate", "breakfast", "calendar", "dictionary", "experiment", "function",
    "variable", "memory", "result", "country", "animal", "holiday", "painting",
]  # fmt: skip
NUM_SENTENCES = 4000


def build_corpus() -> list[str]:
    """Hand-written passages plus seeded template sentences: no file or install
    dependence, and random.Random's choices are stable across Python versions."""
    rng = random.Random(SEED)
    sentences = []
    for _ in range(NUM_SENTENCES):
        parts = (rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS))
        sentence = " ".join(parts) + rng.choice(ENDINGS)
        if rng.random() < 0.5:
            place, noun = rng.choice(PLACES), rng.choice(NOUNS)
            sentence += f" near the {rng.choice(ADJECTIVES)} {noun} in {place}"
        sentences.append(sentence[0].upper() + sentence[1:] + rng.choice(".!?"))
    lines = [" ".join(sentences[i : i + 8]) for i in range(0, len(sentences), 8)]
    return PASSAGES * 20 + lines


def train_tokenizer() -> Tokenizer:
    """Byte-level BPE (any text round-trips) with a BOS prepended like Llama."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(build_corpus(), trainer=trainer)
    if tokenizer.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {tokenizer.get_vocab_size()} tokens")
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tokenizer


def wrap_tokenizer(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
    )


def special_token_ids(tokenizer: Tokenizer) -> dict[str, int]:
    return {
        "pad_token_id": tokenizer.token_to_id(PAD),
        "bos_token_id": tokenizer.token_to_id(BOS),
        "eos_token_id": tokenizer.token_to_id(EOS),
    }


def init_weights(
    model: torch.nn.Module, seed: int, norm_means: dict[str, float]
) -> None:
    """Draw every parameter from one seeded generator in module order; norm
    weights stay near 1 (or ``norm_means[part of the module name]``) so
    activations keep their scale."""
    generator = torch.Generator().manual_seed(seed)
    done: set[int] = set()
    for module_name, module in model.named_modules():
        is_norm = "Norm" in type(module).__name__
        norm_mean = next(
            (mean for part, mean in norm_means.items() if part in module_name), 1.0
        )
        for name, param in module.named_parameters(recurse=False):
            if id(param) in done:
                continue
            done.add(id(param))
            if is_norm and name == "weight":
                mean, std = norm_mean, NORM_STD
            elif param.dim() == 1:
                mean, std = 0.0, BIAS_STD
            else:
                mean, std = 0.0, WEIGHT_STD
            noise = torch.randn(param.shape, generator=generator) * std + mean
            param.data.copy_(noise)
        # A router's expert-selection bias is a buffer: zero unless drawn too,
        # at the scale of the router's weight.
        for name, buffer in module.named_buffers(recurse=False):
            if name == "e_score_correction_bias":
                noise = torch.randn(buffer.shape, generator=generator)
                buffer.copy_(noise * WEIGHT_STD)


def build_model(name: str, tokenizer: Tokenizer, out_dir: Path) -> None:
    """Write one checkpoint into out_dir (config, weights, generation config)."""
    model_type, shape = MODEL_SPECS[name]
    token_ids = special_token_ids(tokenizer)
    seed = SEED + zlib.crc32(name.encode())
    if name in MULTIMODAL_MODELS:
        MULTIMODAL_BUILDERS[model_type](
            shape,
            wrap_tokenizer(tokenizer),
            lambda m: init_weights(m, seed, {}),
            out_dir,
        )
        return
    if name in MXFP4_MODELS:
        build_model(MXFP4_MODELS[name], tokenizer, out_dir)
        write_gpt_oss_mxfp4(out_dir)
        return
    if name in FAMILY_MODELS:
        FAMILY_MODEL_BUILDERS[name](
            {**shape, **token_ids},
            generation_config(tokenizer),
            lambda m: init_weights(m, seed, {}),
            out_dir,
        )
        return
    config = AutoConfig.for_model(model_type, **shape, **token_ids, dtype="float32")
    if name in EAGLE_HEADS:
        build_eagle_head(config, seed, out_dir)
        return
    if name in EAGLE3_HEADS:
        build_eagle3_head(config, seed, out_dir)
        return
    if name in SEQUENCE_CLASSIFIERS:
        classifier = AutoModelForSequenceClassification.from_config(config)
        init_weights(classifier, seed, {})
        classifier.save_pretrained(out_dir)
        return
    if name in DRAFT_MODELS:
        target, num_layers = DRAFT_MODELS[name]
        seed = SEED + zlib.crc32(target.encode())
        config = AutoConfig.for_model(
            model_type, **MODEL_SPECS[target][1], **token_ids, dtype="float32"
        )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    norm_means = {part: mean for (n, part), mean in NORM_MEANS.items() if n == name}
    init_weights(model, seed, norm_means)
    if name in DRAFT_MODELS:
        truncate_layers(model, num_layers)
    model.generation_config = generation_config(tokenizer)
    model.save_pretrained(out_dir)


def generation_config(tokenizer: Tokenizer) -> GenerationConfig:
    """Special token ids; generation stops at the end of text or of a turn."""
    token_ids = special_token_ids(tokenizer)
    im_end_id = tokenizer.token_to_id(IM_END)
    return GenerationConfig(
        **{**token_ids, "eos_token_id": [token_ids["eos_token_id"], im_end_id]}
    )


def build_eagle_head(config: Any, seed: int, out_dir: Path) -> None:
    """A one-layer EAGLE head: the layer's weights as EAGLE checkpoints name
    them (no ``model.`` prefix, no input norm) and a random ``fc``."""
    from safetensors.torch import save_file

    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    init_weights(model, seed, {})
    weights = {
        name.removeprefix("model."): param.detach().contiguous()
        for name, param in model.named_parameters()
        if name.startswith("model.layers.0.") and "input_layernorm" not in name
    }
    generator = torch.Generator().manual_seed(seed + 1)
    hidden = config.hidden_size
    weights["fc.weight"] = torch.randn(hidden, 2 * hidden, generator=generator)
    weights["fc.weight"] *= WEIGHT_STD
    out_dir.mkdir(parents=True, exist_ok=True)
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(out_dir)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def build_eagle3_head(config: Any, seed: int, out_dir: Path) -> None:
    """A one-layer EAGLE-3 head with random weights in its checkpoint's names."""
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    hidden, heads = config.hidden_size, config.num_attention_heads
    kv = config.num_key_value_heads * config.head_dim
    shapes = {
        "midlayer.self_attn.q_proj.weight": (heads * config.head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": (hidden, heads * config.head_dim),
        "midlayer.mlp.gate_proj.weight": (config.intermediate_size, hidden),
        "midlayer.mlp.up_proj.weight": (config.intermediate_size, hidden),
        "midlayer.mlp.down_proj.weight": (hidden, config.intermediate_size),
        "fc.weight": (hidden, len(EAGLE3_AUX_LAYERS) * hidden),
        "lm_head.weight": (config.vocab_size, hidden),
    }
    weights = {
        name: torch.randn(shape, generator=generator) * WEIGHT_STD
        for name, shape in shapes.items()
    }
    for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        weights[f"midlayer.{norm}.weight"] = torch.ones(hidden)
    weights["norm.weight"] = torch.ones(hidden)
    out_dir.mkdir(parents=True, exist_ok=True)
    config.architectures = ["LlamaForCausalLM"]
    config.eagle_aux_hidden_state_layer_ids = EAGLE3_AUX_LAYERS
    config.save_pretrained(out_dir)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def truncate_layers(model: torch.nn.Module, num_layers: int) -> None:
    """Keep a decoder's first ``num_layers`` layers (a draft of the model)."""
    decoder: Any = model.get_decoder()
    decoder.layers = decoder.layers[:num_layers]
    model.config.num_hidden_layers = num_layers


def is_built(model_dir: Path) -> bool:
    stamp = model_dir / STAMP_FILE
    return stamp.is_file() and stamp.read_text().strip() == BUILD_VERSION


def build_one(name: str, tokenizer: Tokenizer, out_root: Path) -> None:
    """Build into a scratch folder, then swap it in, so that an interrupted
    build never looks complete."""
    scratch = out_root / f".{name}.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    build_model(name, tokenizer, scratch)
    if name not in MULTIMODAL_MODELS:  # saved with its processor
        wrap_tokenizer(tokenizer).save_pretrained(scratch)
    (scratch / STAMP_FILE).write_text(BUILD_VERSION + "\n")
    final = out_root / name
    shutil.rmtree(final, ignore_errors=True)
    scratch.rename(final)


def build_all(out_root: Path) -> list[str]:
    """Build the missing or outdated models; return the names built."""
    out_root.mkdir(parents=True, exist_ok=True)
    todo = [name for name in MODEL_SPECS if not is_built(out_root / name)]
    if todo:
        tokenizer = train_tokenizer()
        for name in todo:
            build_one(name, tokenizer, out_root)
    return todo


def describe(name: str) -> str:
    shape = MODEL_SPECS[name][1]
    return f"{name}: {json.dumps(shape, sort_keys=True)}"


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: build_tiny_models.py OUT_DIR")
    start = time.perf_counter()
    hf_logging.disable_progress_bar()
    built = build_all(Path(sys.argv[1]))
    for name in MODEL_SPECS:
        state = "built" if name in built else "up to date"
        print(f"[tiny models] {state:>10}  {describe(name)}")
    print(f"[tiny models] done in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
