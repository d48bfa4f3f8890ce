"""DeepSeek-V2-style models (multi-head latent attention) generate as transformers
does, token for token, in float32: test_generate.py's cases on the latent cache.

"tiny-deepseek-v2" has dense MLPs; "tiny-deepseek-v2-moe" adds routed experts
with a shared expert and a low-rank query (q_lora_rank), as DeepSeek-V3 has.
"""

import pytest
import torch
from models import model_path as model_dir

from e2e.harness import hf_greedy, random_prompts, vllm_engine, vllm_greedy
from e2e.test_generate import MAX_TOKENS, check_against_hf, counter, vocab_size

pytestmark = pytest.mark.slow

MLA_MODELS = ["tiny-deepseek-v2", "tiny-deepseek-v2-moe"]


@pytest.mark.parametrize("block_size", [16, 128])
@pytest.mark.parametrize("name", MLA_MODELS)
def test_mla_generate_matches_hf(name, block_size):
    check_against_hf(name, block_size=block_size)


@pytest.mark.parametrize("name", MLA_MODELS)
def test_mla_generate_matches_hf_with_preemption(name):
    # As for tiny-llama: 24 blocks of 16 tokens cannot hold the batch at once.
    metrics = check_against_hf(
        name,
        block_size=16,
        max_model_len=352,
        num_gpu_blocks_override=24,
        kv_cache_memory_bytes=None,
    )
    assert counter(metrics, "vllm:num_preemptions") > 0


@pytest.mark.parametrize("name", MLA_MODELS)
def test_mla_generate_matches_hf_with_chunked_prompts(name):
    # Later chunks read the earlier ones' latents back from the cache as context.
    check_against_hf(
        name, block_size=16, max_num_batched_tokens=64, enable_chunked_prefill=True
    )


@pytest.mark.parametrize("name", MLA_MODELS)
def test_mla_generate_matches_hf_with_prefix_cache_hits(name):
    shared = random_prompts([200], vocab_size(name), seed=7)[0]
    tails = random_prompts([1, 9, 40], vocab_size(name), seed=8)
    prompts = [shared + tail for tail in tails]
    expected = hf_greedy(model_dir(name), prompts, MAX_TOKENS, torch.float32)
    with vllm_engine(model_dir(name), block_size=16, enable_prefix_caching=True) as llm:
        first = vllm_greedy(llm, prompts[:1], MAX_TOKENS)
        rest = vllm_greedy(llm, prompts[1:], MAX_TOKENS)
        metrics = {m.name: m for m in llm.get_metrics()}
    assert first + rest == expected
    assert counter(metrics, "vllm:prefix_cache_hits") > 0
