"""The local models: the tiny ones build byte for byte the same and generate
varied text; the converted SmolLM2 still knows its capitals and chats."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from models import (
    DEEPSEEK_FAMILY_MODELS,
    DRAFT_MODELS,
    EAGLE_HEADS,
    LONG_CONTEXT_MODELS,
    MULTIMODAL_MODELS,
    MXFP4_MODELS,
    POOLING_MODELS,
    QWEN3_5_MTP_MODELS,
    SMOLLM2,
    TINY_MODELS,
    model_path,
)
from transformers import AutoModelForCausalLM, AutoTokenizer

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build_tiny_models.py"
PROMPT = "The capital of France is"
NUM_NEW_TOKENS = 16


def start_build(out_dir: Path, hash_seed: str) -> subprocess.Popen:
    # Different hash seeds catch any output that depends on set or dict order.
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    command = [sys.executable, str(BUILD_SCRIPT), str(out_dir)]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)


def read_tree(root: Path) -> dict[str, bytes]:
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


@pytest.mark.slow  # builds every local model again, in a process of its own
def test_tiny_models_build_deterministically(tmp_path: Path) -> None:
    """A build under another hash seed equals the set-up's build (.cache/models,
    built with Python's random one) byte for byte. A cache older than the
    scripts fails here too: `make models` rebuilds it."""
    build = start_build(tmp_path, "1")
    assert build.wait() == 0
    fresh = read_tree(tmp_path)
    built = {name.split("/")[0] for name in fresh}
    assert built == {
        *TINY_MODELS,
        *DEEPSEEK_FAMILY_MODELS,
        *QWEN3_5_MTP_MODELS,
        *POOLING_MODELS,
        *MULTIMODAL_MODELS,
        *DRAFT_MODELS,
        *EAGLE_HEADS,
        *LONG_CONTEXT_MODELS,
        *MXFP4_MODELS,
    }
    cached = {
        f"{model}/{name}": data
        for model in built
        for name, data in read_tree(Path(model_path(model))).items()
    }
    assert cached.keys() == fresh.keys()
    differing = [name for name in fresh if fresh[name] != cached[name]]
    assert differing == []


def greedy_generate(path: str, dtype: torch.dtype, num_new_tokens: int):
    """Greedy continuation of PROMPT: (new token ids, per-step scores, tokenizer)."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    input_ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    output = model.generate(
        input_ids,
        max_new_tokens=num_new_tokens,
        min_new_tokens=num_new_tokens,
        do_sample=False,
        output_scores=True,
        return_dict_in_generate=True,
        pad_token_id=tokenizer.pad_token_id,
    )
    return output.sequences[0, input_ids.shape[1] :].tolist(), output.scores, tokenizer


@pytest.mark.parametrize("name", TINY_MODELS)
def test_tiny_model_generates_varied_tokens(name: str) -> None:
    path = model_path(name)
    new_ids, scores, _ = greedy_generate(path, torch.float32, NUM_NEW_TOKENS)
    assert len(set(new_ids)) >= NUM_NEW_TOKENS // 2, new_ids
    # A clear winner at each step, so that other implementations agree on it.
    for step_scores in scores:
        top2 = step_scores[0].topk(2).values
        assert top2[0] > top2[1]


@pytest.mark.parametrize("name", TINY_MODELS)
def test_tiny_model_chat_template_renders(name: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_path(name))
    messages = [{"role": "user", "content": "Hello!"}]
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert text == "<|bos|><|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize(("draft", "target"), DRAFT_MODELS.items())
def test_draft_model_is_the_first_layer_of_its_target(draft: str, target: str):
    from safetensors.torch import load_file

    draft_weights = load_file(Path(model_path(draft)) / "model.safetensors")
    target_weights = load_file(Path(model_path(target)) / "model.safetensors")
    assert not any(".layers.1." in name for name in draft_weights)
    for name, weight in draft_weights.items():
        assert torch.equal(weight, target_weights[name]), name
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (Path(model_path(draft)) / name).read_bytes() == (
            Path(model_path(target)) / name
        ).read_bytes()


def test_smollm2_continues_with_paris() -> None:
    # float32 on CPU is several times faster than bf16; the greedy pick is the same.
    new_ids, _, tokenizer = greedy_generate(model_path(SMOLLM2), torch.float32, 3)
    continuation = tokenizer.decode(new_ids)
    assert continuation.startswith(" Paris"), continuation


def test_smollm2_has_chat_template() -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_path(SMOLLM2))
    messages = [{"role": "user", "content": "Hi"}]
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert "<|im_start|>user\nHi<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
