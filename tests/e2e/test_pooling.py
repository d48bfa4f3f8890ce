"""Pooling models on the plugin (``runner="pooling"``) against transformers.

Embeddings are the model's final hidden states pooled (last token or mean) and
L2-normalised, as vLLM's embed pooler does; classification is the sequence
classifier's softmax. Prompts of mixed lengths run in one batch, padded to buckets.
"""

import json
import pathlib
import shutil

import pytest
import torch
from models import model_path
from transformers import AutoModel, AutoModelForSequenceClassification

from e2e.harness import compiled_graphs, random_prompts, vllm_engine

MODEL = "tiny-llama"
CLASSIFIER = "tiny-llama-classify"
VOCAB_SIZE = 1024
MAX_MODEL_LEN = 256
BLOCK_SIZE = 128  # the platform's default
# One-token, within one block, across blocks (block size 128), near the limit.
PROMPT_LENGTHS = [1, 7, 40, 129, 200]
MIN_COSINE = 0.9999
# Compiled emulation over six prompt buckets: batch 1, 2 x query 32, 64, 96.
SMALL_BUCKETS = {
    "VLLM_PROMPT_SEQ_BUCKET_MIN": "32",
    "VLLM_PROMPT_SEQ_BUCKET_STEP": "32",
    "VLLM_PROMPT_SEQ_BUCKET_MAX": "96",
    "VLLM_HPU_COMPILE_BACKEND": "eager",
}
SMALL_ENGINE = dict(
    block_size=16,
    max_model_len=128,
    max_num_seqs=2,
    max_num_batched_tokens=192,
    enable_prefix_caching=False,
    enable_chunked_prefill=False,
)


@torch.no_grad()
def hf_embeddings(
    prompts: list[list[int]], pooling_type: str, bidirectional: bool = False
) -> list[torch.Tensor]:
    """transformers' final hidden states, pooled (ALL: every token's), one prompt
    at a time; with
    ``bidirectional`` under an all-visible mask (a prepared 4D mask is used as is)."""
    model = AutoModel.from_pretrained(model_path(MODEL), dtype=torch.float32).eval()
    pooled = []
    for prompt in prompts:
        mask = torch.zeros(1, 1, len(prompt), len(prompt)) if bidirectional else None
        output = model(input_ids=torch.tensor([prompt]), attention_mask=mask)
        hidden = output.last_hidden_state[0]
        by_type = {
            "LAST": hidden[-1],
            "MEAN": hidden.mean(dim=0),
            "CLS": hidden[0],
            "ALL": hidden,
        }
        pooled.append(torch.nn.functional.normalize(by_type[pooling_type], dim=-1))
    return pooled


def assert_embeddings_match(
    actual: list[list[float]], expected: list[torch.Tensor]
) -> None:
    assert len(actual) == len(expected)
    for index, (got, want) in enumerate(zip(actual, expected, strict=True)):
        cosine = torch.nn.functional.cosine_similarity(
            torch.tensor(got), want, dim=0
        ).item()
        assert cosine > MIN_COSINE, f"prompt {index}: cosine {cosine}"


@pytest.mark.parametrize("pooling_type", ["LAST", "MEAN", "CLS"])
def test_embed_equals_transformers(pooling_type: str) -> None:
    from vllm.config import PoolerConfig

    prompts = random_prompts(PROMPT_LENGTHS, VOCAB_SIZE, seed=1)
    with vllm_engine(
        model_path(MODEL),
        runner="pooling",
        pooler_config=PoolerConfig(pooling_type=pooling_type),
        max_model_len=MAX_MODEL_LEN,
    ) as llm:
        assert set(llm.llm_engine.get_supported_tasks()) == {"embed", "token_embed"}
        outputs = llm.embed([{"prompt_token_ids": p} for p in prompts])
    actual = [o.outputs.embedding for o in outputs]
    assert_embeddings_match(actual, hf_embeddings(prompts, pooling_type))


def test_embed_last_token_with_chunked_prompts_and_prefix_hits() -> None:
    """Last-token pooling takes prompts split across steps and prompts starting
    after cached blocks (vLLM keeps chunked prefill and prefix caching on for
    it): only the step finishing a prompt pools it."""
    prompts = random_prompts(PROMPT_LENGTHS, VOCAB_SIZE, seed=2)
    with vllm_engine(
        model_path(MODEL),
        runner="pooling",
        max_model_len=MAX_MODEL_LEN,
        enable_chunked_prefill=True,
        max_num_batched_tokens=64,
        max_num_seqs=4,
    ) as llm:
        inputs = [{"prompt_token_ids": p} for p in prompts]
        first = [o.outputs.embedding for o in llm.embed(inputs)]
        # The same prompts again: their full blocks are now prefix-cache hits.
        outputs = llm.embed(inputs)
        again = [o.outputs.embedding for o in outputs]
    assert [o.num_cached_tokens for o in outputs] == [
        (n - 1) // BLOCK_SIZE * BLOCK_SIZE for n in PROMPT_LENGTHS
    ]
    expected = hf_embeddings(prompts, "LAST")
    assert_embeddings_match(first, expected)
    assert_embeddings_match(again, expected)


def test_token_embed_with_chunked_prompts() -> None:
    """Token-wise pooling gathers a chunked prompt's hidden states step by step."""
    from vllm.config import PoolerConfig

    prompts = random_prompts(PROMPT_LENGTHS, VOCAB_SIZE, seed=7)
    with vllm_engine(
        model_path(MODEL),
        runner="pooling",
        pooler_config=PoolerConfig(task="token_embed"),
        max_model_len=MAX_MODEL_LEN,
        enable_chunked_prefill=True,
        max_num_batched_tokens=64,
        max_num_seqs=4,
    ) as llm:
        inputs = [{"prompt_token_ids": p} for p in prompts]
        tokens = llm.encode(inputs, pooling_task="token_embed")
    for output, want in zip(tokens, hf_embeddings(prompts, "ALL"), strict=True):
        assert output.outputs.data.shape == want.shape
        cosine = torch.cosine_similarity(output.outputs.data, want, dim=-1)
        assert cosine.min() > MIN_COSINE


def test_mean_pooling_refuses_chunked_prefill() -> None:
    from vllm.config import PoolerConfig

    with (
        pytest.raises(ValueError, match="MEAN pooling cannot pool"),
        vllm_engine(
            model_path(MODEL),
            runner="pooling",
            pooler_config=PoolerConfig(pooling_type="MEAN"),
            max_model_len=MAX_MODEL_LEN,
            enable_chunked_prefill=True,
        ),
    ):
        pass


def bidirectional_copy(tmp_path: pathlib.Path) -> pathlib.Path:
    """tiny-llama with ``is_causal: false``: vLLM's Llama then builds its layers
    as encoder-only attention, as for bidirectional embedding models."""
    model_dir = tmp_path / "tiny-llama-bidirectional"
    shutil.copytree(model_path(MODEL), model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "is_causal": False}))
    return model_dir


@pytest.mark.parametrize("pooling_type", ["LAST", "MEAN"])
def test_embed_bidirectional_equals_transformers(
    pooling_type: str, tmp_path: pathlib.Path
) -> None:
    """A decoder made bidirectional runs under a bidirectional mask."""
    from vllm.config import PoolerConfig

    model_dir = bidirectional_copy(tmp_path)
    prompts = random_prompts(PROMPT_LENGTHS, VOCAB_SIZE, seed=6)
    with vllm_engine(
        str(model_dir),
        runner="pooling",
        pooler_config=PoolerConfig(pooling_type=pooling_type),
        max_model_len=MAX_MODEL_LEN,
    ) as llm:
        outputs = llm.embed([{"prompt_token_ids": p} for p in prompts])
    actual = [o.outputs.embedding for o in outputs]
    expected = hf_embeddings(prompts, pooling_type, bidirectional=True)
    assert_embeddings_match(actual, expected)
    causal = hf_embeddings(prompts, pooling_type)
    assert torch.cosine_similarity(torch.tensor(actual[-1]), causal[-1], dim=0) < 0.99


def test_bidirectional_model_refuses_to_generate(tmp_path: pathlib.Path) -> None:
    with (
        pytest.raises(ValueError, match="start vLLM with --runner pooling"),
        vllm_engine(str(bidirectional_copy(tmp_path)), max_model_len=MAX_MODEL_LEN),
    ):
        pass


@torch.no_grad()
def test_classify_equals_transformers() -> None:
    prompts = random_prompts(PROMPT_LENGTHS, VOCAB_SIZE, seed=3)
    path = model_path(CLASSIFIER)
    model = AutoModelForSequenceClassification.from_pretrained(
        path, dtype=torch.float32
    ).eval()
    expected = [
        model(input_ids=torch.tensor([p])).logits[0].softmax(dim=0) for p in prompts
    ]
    with vllm_engine(path, max_model_len=MAX_MODEL_LEN) as llm:
        assert "classify" in llm.llm_engine.get_supported_tasks()
        outputs = llm.classify([{"prompt_token_ids": p} for p in prompts])
    for output, want in zip(outputs, expected, strict=True):
        torch.testing.assert_close(torch.tensor(output.outputs.probs), want)


def test_warmup_covers_the_pooling_path(hpu_env, vllm_log) -> None:
    """Warmup runs every prompt bucket through the pooler and no decode bucket
    (pooling models never decode); serving inside the ranges compiles nothing."""
    hpu_env(**SMALL_BUCKETS)
    prompts = random_prompts([1, 5, 31, 60, 90], VOCAB_SIZE, seed=4)
    before_warmup = compiled_graphs()
    with vllm_engine(
        model_path(MODEL), runner="pooling", enforce_eager=False, **SMALL_ENGINE
    ) as llm:
        before = compiled_graphs()
        assert before > before_warmup
        outputs = llm.embed([{"prompt_token_ids": p} for p in prompts])
        assert compiled_graphs() == before
    actual = [o.outputs.embedding for o in outputs]
    assert_embeddings_match(actual, hf_embeddings(prompts, "LAST"))
    steps = [m for m in vllm_log.messages() if m.startswith("[Warmup][")]
    assert any(m.startswith("[Warmup][Prompt][6/6]") for m in steps)
    assert not any("Decode" in m for m in steps)
