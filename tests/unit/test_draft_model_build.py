"""The distilled draft model's build (scripts/build_draft_model.py): its
prompts are not the benchmark's, its sampled loss scores each label among
its candidates, and its embedding starts as the
target's projection."""

import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import build_draft_model
from draft_prompts import draft_prompts

from benchmarks.spec_decode import PROMPTS

# What makes each benchmark prompt itself: a draft trained on them would be
# tuned to the benchmark.
BENCHMARK_PATTERNS = ["1, 2, 3,", "cat sat", "Monday", "Tuesday", "def add", "def sub"]


def test_prompts_are_not_the_benchmarks() -> None:
    prompts = draft_prompts()
    assert len(set(prompts)) == len(prompts) > 100
    for pattern in BENCHMARK_PATTERNS:
        assert any(pattern in prompt for prompt in PROMPTS)
        assert not [prompt for prompt in prompts if pattern in prompt], pattern


def tiny_llama(vocab_size: int, hidden_size: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def test_sampled_loss_is_the_cross_entropy_over_its_candidates(monkeypatch) -> None:
    """The labels against themselves and a few random tokens, not the whole
    vocabulary; each label scored at its own candidate column."""
    model = tiny_llama(vocab_size=40, hidden_size=32)
    inputs = torch.randint(40, (3, 7), generator=torch.Generator().manual_seed(1))
    labels = torch.randint(40, (3, 7), generator=torch.Generator().manual_seed(2))
    labels[2, 4:] = build_draft_model.IGNORE
    monkeypatch.setattr(build_draft_model, "NUM_NEGATIVES", 5)
    sampled = build_draft_model.sampled_loss(
        model, inputs, labels, torch.Generator().manual_seed(3)
    )
    real = labels != build_draft_model.IGNORE
    negatives = torch.randint(40, (5,), generator=torch.Generator().manual_seed(3))
    candidates = sorted(set(labels[real].tolist()) | set(negatives.tolist()))
    assert len(candidates) < 40
    logits = model(input_ids=inputs).logits[real][:, candidates]
    columns = torch.tensor([candidates.index(label) for label in labels[real]])
    expected = torch.nn.functional.cross_entropy(logits, columns)
    torch.testing.assert_close(sampled, expected)


def test_initial_embedding_keeps_the_targets_logits_in_its_span(monkeypatch) -> None:
    target = tiny_llama(vocab_size=50, hidden_size=24)
    monkeypatch.setattr(build_draft_model, "HIDDEN_SIZE", 8)
    monkeypatch.setattr(build_draft_model, "HEAD_DIM", 4)
    monkeypatch.setattr(build_draft_model, "NUM_HEADS", 2)
    monkeypatch.setattr(build_draft_model, "NUM_KV_HEADS", 1)
    monkeypatch.setattr(build_draft_model, "INTERMEDIATE_SIZE", 16)
    draft = build_draft_model.initial_draft(target)
    embedding = target.get_input_embeddings().weight.detach()
    projected = draft.get_input_embeddings().weight.detach()
    assert projected.shape == (50, 8)
    # A target state in the span of the leading directions scores every
    # token as the draft's projected state does (up to the rescaling).
    _, _, vh = torch.linalg.svd(embedding, full_matrices=False)
    state = torch.randn(8) @ vh[:8]
    scale = embedding.norm() / (embedding @ vh[:8].T).norm()
    torch.testing.assert_close(embedding @ state * scale, projected @ (vh[:8] @ state))
