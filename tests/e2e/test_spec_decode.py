"""Speculative decoding with n-gram drafts and a draft model: greedy outputs
equal transformers' token for token (float32), and drafts get accepted."""

import pytest
import torch
from models import model_path as model_dir

from e2e.harness import (
    default_engine,
    hf_greedy,
    one_bucket,
    random_prompts,
    vllm_engine,
    vllm_greedy,
)

pytestmark = pytest.mark.slow

NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 3,
}


def draft_model(name: str) -> dict:
    return {
        "method": "draft_model",
        "model": model_dir(name),
        "num_speculative_tokens": 3,
    }


def counter(llm, name: str) -> float:
    metrics = {m.name: m for m in llm.get_metrics()}
    return metrics[name].value if name in metrics else 0.0


def repetitive_prompts() -> list[list[int]]:
    """Token patterns repeated, three after a shared prefix (tiny-llama's vocab)."""
    pattern, shared = random_prompts([5, 48], 1024, seed=1)
    tails = random_prompts([1, 7, 70], 1024, seed=2)
    return [pattern * 6, *(shared + pattern * 2 + tail for tail in tails)]


@pytest.mark.parametrize(
    "speculative_config",
    [NGRAM, draft_model("tiny-llama-draft")],
    ids=["ngram", "draft_model"],
)
def test_greedy_matches_hf_with_preemption_chunks_and_prefix_hits(
    speculative_config: dict,
):
    # Repeated patterns give the n-gram proposer drafts; the draft model (the
    # target's first layer) agrees with the target now and then. Most drafts
    # are rejected: their KV, the target's and the draft's, must be overwritten,
    # never cached. A shared prefix gives prefix hits; 20 blocks of 16 tokens
    # force preemption; a 48-token step budget splits the longer prompts into
    # chunks.
    prompts = repetitive_prompts()
    expected = hf_greedy(model_dir("tiny-llama"), prompts, 24, torch.float32)
    # The draft model through vLLM's default engine (its core in a process of
    # its own); n-gram in-process.
    engine = (
        default_engine if speculative_config["method"] == "draft_model" else vllm_engine
    )
    with engine(
        model_dir("tiny-llama"),
        block_size=16,
        max_model_len=256,
        num_gpu_blocks_override=20,
        kv_cache_memory_bytes=None,
        max_num_batched_tokens=48,
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
        speculative_config=speculative_config,
    ) as llm:
        assert vllm_greedy(llm, prompts, 24) == expected
        assert counter(llm, "vllm:spec_decode_num_draft_tokens") > 0
        if speculative_config["method"] == "draft_model":
            assert counter(llm, "vllm:spec_decode_num_accepted_tokens") > 0
        assert counter(llm, "vllm:num_preemptions") > 0
        assert counter(llm, "vllm:prefix_cache_hits") > 0


def test_ngram_accepts_drafts_on_a_repetitive_prompt():
    """SmolLM2 continues a count, which the prompt's n-grams predict."""
    from transformers import AutoTokenizer

    model = model_dir("smollm2-135m-instruct")
    prompt = AutoTokenizer.from_pretrained(model)("1, 2, 3, 4, 5, 6, 7, 8, 9,")
    prompts = [prompt["input_ids"]]
    expected = hf_greedy(model, prompts, 12, torch.float32)
    with vllm_engine(model, max_model_len=128, speculative_config=NGRAM) as llm:
        assert vllm_greedy(llm, prompts, 12) == expected
        assert counter(llm, "vllm:spec_decode_num_accepted_tokens") > 0


# Compiled with one bucket per kind of pass, as a compiled test warms up only
# what it runs: both prompts in one merged prompt pass (89 tokens), decodes
# and verifications of up to two rows over up to 16 blocks (verification
# buckets are the decode buckets' twins).
ONE_PASS_SHAPE = {
    **one_bucket("PROMPT_SEQ", 96),
    **one_bucket("DECODE_BS", 2),
    **one_bucket("DECODE_BLOCK", 16),
}


@pytest.mark.parametrize(
    "speculative_config",
    [
        NGRAM,
        draft_model("tiny-llama"),
        {
            "method": "eagle3",
            "model": model_dir("tiny-llama-eagle3"),
            "num_speculative_tokens": 3,
        },
    ],
    ids=["ngram", "draft_model_of_itself", "eagle3"],
)
def test_speculation_compiles_nothing_after_warmup(hpu_env, speculative_config: dict):
    """Compiled emulation without prefix caching or chunked prefill: the
    verification buckets (k + 1 queries per row) are warmed up too, and a
    draft model's or EAGLE-3 head's passes (the target returning its layers'
    states too), through the same buckets. The target
    drafting for itself accepts (almost) every draft: its draft KV is the
    target's."""
    from torch._dynamo.utils import counters

    hpu_env(VLLM_HPU_COMPILE_BACKEND="eager", **ONE_PASS_SHAPE)
    prompts = repetitive_prompts()[:2]
    expected = hf_greedy(model_dir("tiny-llama"), prompts, 24, torch.float32)
    with vllm_engine(
        model_dir("tiny-llama"),
        enforce_eager=False,
        block_size=16,
        max_model_len=128,
        max_num_seqs=2,
        max_num_batched_tokens=128,
        enable_prefix_caching=False,
        enable_chunked_prefill=False,
        speculative_config=speculative_config,
    ) as llm:
        warmed = int(counters["stats"]["unique_graphs"])
        drafting_for_itself = speculative_config.get("model") == model_dir("tiny-llama")
        if drafting_for_itself:
            llm.collective_rpc(_count_draft_passes)
        assert vllm_greedy(llm, prompts, 24) == expected
        assert int(counters["stats"]["unique_graphs"]) == warmed
        drafted = counter(llm, "vllm:spec_decode_num_draft_tokens")
        assert drafted > 0
        if drafting_for_itself:
            accepted = counter(llm, "vllm:spec_decode_num_accepted_tokens")
            assert accepted >= 0.9 * drafted
            # k passes per proposal, no more: a row whose drafts were all
            # accepted writes its last draft's KV in its first pass (two
            # queries), with no decode of its own.
            ((proposals, passes, catch_ups),) = llm.collective_rpc(_draft_passes)
            assert proposals > 0 and passes == 3 * proposals
            assert catch_ups > 0


def _count_draft_passes(worker) -> None:
    """From now on, count the draft model's proposals (with drafts), its
    passes, and the passes where a row reads two tokens."""
    proposer = worker.model_runner.caps.spec.proposer
    counts = proposer.counted = [0, 0, 0]
    propose, decode = proposer.propose, proposer._decode

    def counted_propose(*args):
        drafts = propose(*args)
        counts[0] += any(drafts)
        return drafts

    def counted_decode(seqs, *args):
        counts[1] += 1
        counts[2] += any(seq.layout.num_scheduled_tokens > 1 for seq in seqs)
        return decode(seqs, *args)

    proposer.propose, proposer._decode = counted_propose, counted_decode


def _draft_passes(worker) -> list[int]:
    return worker.model_runner.caps.spec.proposer.counted
