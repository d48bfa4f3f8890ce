"""The documented Gaudi start-up example, through vLLM: prompt bucket variables
1/32/4 x 128/128/1024 with prefix caching and chunked prefill off log the
documented bucket lines, and prompt passes hold several rows of those buckets."""

from models import model_path

from e2e.harness import random_prompts, vllm_engine, vllm_greedy

README_EXAMPLE = {
    "VLLM_PROMPT_BS_BUCKET_MIN": "1",
    "VLLM_PROMPT_BS_BUCKET_STEP": "32",
    "VLLM_PROMPT_BS_BUCKET_MAX": "4",
    "VLLM_PROMPT_SEQ_BUCKET_MIN": "128",
    "VLLM_PROMPT_SEQ_BUCKET_STEP": "128",
    "VLLM_PROMPT_SEQ_BUCKET_MAX": "1024",
    "VLLM_SKIP_WARMUP": "true",  # the bucket lines come before warmup
}
BUCKETS = [(bs, seq) for bs in (1, 2, 4) for seq in range(128, 1025, 128)]
PROMPT_LENS = [412, 300, 350]


def prompt_padding(worker):
    counter = worker.model_runner.buckets.stats.prompt
    return counter.steps, counter.real, counter.padded


def test_readme_prompt_bucket_example_logs_and_runs_its_buckets(hpu_env, vllm_log):
    hpu_env(**README_EXAMPLE)
    with vllm_engine(
        model_path("tiny-llama"),
        enable_prefix_caching=False,
        enable_chunked_prefill=False,
        max_model_len=1024,
        max_num_batched_tokens=4096,
        max_num_seqs=4,
        enforce_eager=True,
    ) as llm:
        vllm_greedy(llm, random_prompts(PROMPT_LENS, 1024, seed=5), max_tokens=2)
        ((steps, real, padded),) = llm.collective_rpc(prompt_padding)
    logs = vllm_log.messages()
    config_line = "Prompt bucket config (min, step, max_warmup) "
    assert config_line + "bs:[1, 32, 4], seq:[128, 128, 1024]" in logs
    listed = ", ".join(str(bucket) for bucket in BUCKETS)
    assert f"Generated 24 prompt buckets: [{listed}]" in logs
    # The one line saying why prompt passes keep one row per prompt.
    assert any(m.startswith("VLLM_PROMPT_BS_BUCKET_MIN, ") for m in logs)
    # The runner splits the step where that pads less than (4, 512) would: 412
    # alone in (1, 512), 300 and 350 as two rows of (2, 384).
    assert (steps, real) == (2, sum(PROMPT_LENS))
    assert padded == (512 - 412) + (2 * 384 - 300 - 350)
