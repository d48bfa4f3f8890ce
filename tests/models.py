"""Where tests find the local models `make test-setup` builds under .cache/models.

A missing model fails the test with the command that builds it: no hub fallback.
Plain functions, not fixtures: an imported fixture trips linters (F811).
"""

from pathlib import Path

import pytest
from conftest import MODELS_DIR

# Attention variants: sliding windows, soft-capping, ALiBi, head sizes 32 and 40.
VARIANT_MODELS = (
    "tiny-mistral-sw",
    "tiny-phi3-sw",
    "tiny-gemma2",
    "tiny-bloom",
    "tiny-falcon-alibi",
    "tiny-llama-h32",
    "tiny-llama-h40",
)
# Model families with their own attention and MoE pieces (issue 33): gpt-oss and
# Llama 4 (text), scripts/tiny_families.py; Gemma 4 (text), scripts/tiny_gemma4.py.
FAMILY_MODELS = ("tiny-gpt-oss", "tiny-llama4", "tiny-gemma4")
# Hybrid state-space families (issue 33, design_hybrid), same script: Granite-4.0-H
# (Mamba2) and Qwen3-Next (gated delta-net); Qwen3.5 dense and MoE (gated
# delta-net, scripts/tiny_qwen3_5.py); Nemotron-H (Mamba2, MLP, MoE and attention
# layers, scripts/tiny_nemotron_h.py), run by the plugin
# (tests/e2e/test_hybrid_families.py) and by transformers.
HYBRID_MODELS = (
    "tiny-granite-4.0-h",
    "tiny-qwen3-next",
    "tiny-qwen3.5",
    "tiny-qwen3.5-moe",
    "tiny-nemotron-h",
)
# DeepSeek-V3.2's sparse attention and DeepSeek-V3's MTP layer
# (scripts/tiny_deepseek.py): tests/e2e/test_sparse_attention.py, test_spec_decode.py.
DEEPSEEK_FAMILY_MODELS = ("tiny-deepseek-v32", "tiny-deepseek-v3-mtp")
# Qwen3.5 dense and MoE with an MTP layer (scripts/tiny_qwen3_5.py):
# tests/e2e/test_hybrid_features.py.
QWEN3_5_MTP_MODELS = ("tiny-qwen3.5-mtp", "tiny-qwen3.5-moe-mtp")
TINY_MODELS = (
    "tiny-llama",
    "tiny-qwen2",
    "tiny-qwen3",
    "tiny-mistral",
    "tiny-opt",
    "tiny-gpt2",
    "tiny-mixtral",
    "tiny-qwen2-moe",
    "tiny-qwen3-moe",
    "tiny-glm4-moe",
    "tiny-deepseek-v2",
    "tiny-deepseek-v2-moe",
    "tiny-deepseek-v2-q192",
    "tiny-deepseek-v2-moe-128",
    *VARIANT_MODELS,
    *FAMILY_MODELS,
    *HYBRID_MODELS,
)
# Built by the set-up too, but with a classification head: they do not generate.
POOLING_MODELS = ("tiny-llama-classify",)
# Built by the set-up too, with their processors: they take images.
MULTIMODAL_MODELS = (
    "tiny-llava",
    "tiny-qwen2-vl",
    "tiny-qwen2.5-vl",
    "tiny-qwen3-vl",
    "tiny-mistral3",
    "tiny-gemma3",
    "tiny-llama4-vision",
    "tiny-qwen3.5-vl",
    "tiny-qwen3.5-moe-vl",
    "tiny-gemma4-vl",
)
# Built by the set-up too: a target's first layer, its speculative draft.
DRAFT_MODELS = {"tiny-llama-draft": "tiny-llama"}
# Built by the set-up too: tiny-gpt-oss with its experts in OpenAI's MXFP4
# (scripts/tiny_mxfp4.py), as gpt-oss ships.
MXFP4_MODELS = ("tiny-gpt-oss-mxfp4",)
# Built by the set-up too: EAGLE and EAGLE-3 heads for tiny-llama, as vLLM loads them.
EAGLE_HEADS = ("tiny-llama-eagle", "tiny-llama-eagle3")
# Built by the set-up too: 131072 positions with llama3, YaRN and LongRoPE rope
# scaling, one layer and one head of 64 (tests/e2e/test_long_context.py).
LONG_CONTEXT_MODELS = (
    "tiny-llama3-128k",
    "tiny-qwen2-yarn-128k",
    "tiny-phi3-longrope-128k",
)
SMOLLM2 = "smollm2-135m-instruct"


def model_path(name: str) -> str:
    """Path of a built model as a string, as vLLM and transformers take it."""
    path: Path = MODELS_DIR / name
    if not (path / "config.json").is_file():
        pytest.fail(
            f"{path} is missing: run `make test-setup` to build the local models"
        )
    return str(path)
