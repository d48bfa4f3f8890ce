"""KV offloading to host memory (--kv-offloading-size) through the plugin's spec.

A device cache of 24 blocks serves six prompts whose prefixes take 36: by the
time a prefix comes back, the device has evicted it, and its blocks come back
from host memory. The outputs equal those of a device cache that holds
everything (tiny-llama, greedy, float32). The offloading engine runs as a user
runs it, through vLLM's default engine (its core in a process of its own, which
runs the config hooks a second time: issue 50's hang); the large cache runs
in this process.
"""

import random

import pytest
from models import model_path

from e2e.harness import DEFAULT_ENGINE, core_in_own_process, plugin_env, vllm_engine

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
BLOCK_SIZE = 16
PREFIX_BLOCKS = 6
NUM_PREFIXES = 6
# Keys and values of both layers: 2 * 2 * 16 tokens * 2 heads * 64 * fp32.
BLOCK_BYTES = 2 * 2 * BLOCK_SIZE * 2 * 64 * 4
DEVICE_BLOCKS = 24  # < NUM_PREFIXES * PREFIX_BLOCKS
MAX_TOKENS = 6


def prompts() -> list[list[int]]:
    """Each prefix twice, with different suffixes, all prefixes in between."""
    rng = random.Random(0)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(3, 1024) for _ in range(n)]

    prefixes = [tokens(PREFIX_BLOCKS * BLOCK_SIZE) for _ in range(NUM_PREFIXES)]
    return [p + tokens(5) for p in prefixes] + [p + tokens(7) for p in prefixes]


def generate(**engine_args) -> tuple[list[list[int]], dict[str, float], int, bool]:
    """Greedy tokens of each prompt sent one by one, counters summed by name,
    the number of device KV blocks, and whether the core ran apart."""
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    with vllm_engine(
        str(model_path(MODEL)),
        block_size=BLOCK_SIZE,
        max_model_len=256,
        enforce_eager=True,
        **engine_args,
    ) as llm:
        outputs = []
        for prompt in prompts():
            (output,) = llm.generate(
                TokensPrompt(prompt_token_ids=prompt), params, use_tqdm=False
            )
            outputs.append(list(output.outputs[0].token_ids))
        counters: dict[str, float] = {}
        for metric in llm.get_metrics():
            value = getattr(metric, "value", None)
            if isinstance(value, (int, float)):
                counters[metric.name] = counters.get(metric.name, 0) + value
        num_blocks = llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
        apart = core_in_own_process(llm)
    return outputs, counters, num_blocks, apart


def test_kv_offloading_serves_evicted_prefixes_from_host() -> None:
    expected, _, _, _ = generate()
    with plugin_env(DEFAULT_ENGINE.items()):
        outputs, counters, num_blocks, apart = generate(
            kv_cache_memory_bytes=DEVICE_BLOCKS * BLOCK_BYTES,
            kv_offloading_size=0.01,
            enable_prefix_caching=True,
        )
    assert apart and num_blocks == DEVICE_BLOCKS
    assert outputs == expected
    # Prefix hits the scheduler found in host memory, and the bytes the plugin's
    # copier brought back for them: whole blocks, both layers' keys and values.
    hits = counters["vllm:external_prefix_cache_hits"]
    assert hits >= (NUM_PREFIXES - 1) * PREFIX_BLOCKS * BLOCK_SIZE
    assert counters["vllm:kv_offload_load_bytes"] == hits // BLOCK_SIZE * BLOCK_BYTES
    assert counters["vllm:kv_offload_store_bytes"] >= (
        NUM_PREFIXES * PREFIX_BLOCKS * BLOCK_BYTES
    )
