"""Warm restarts and memory-safe warmup (issue 36).

A restart in a fresh process loads every compiled graph from VLLM_HPU_CACHE_DIR
(benchmarks/startup.py's children, inductor, four buckets); a KV cache too small
for max_num_seqs plans no decode batch it cannot fill, and a device with no
memory left for graphs leaves them out with one line instead of failing.
"""

import ast
import re

import pytest
import torch
from models import model_path

from benchmarks import startup
from e2e.harness import hf_greedy, random_prompts, vllm_engine, vllm_greedy

pytestmark = pytest.mark.slow

# Two prompt and two decode buckets (block 128, two sequences of 128 tokens).
RESTART_ARGS = [
    "--model",
    model_path("tiny-llama"),
    "--backend",
    "inductor",
    "--max-model-len",
    "128",
    "--max-num-seqs",
    "2",
    "--max-num-batched-tokens",
    "128",
    "--restart",
]


# A restart's warmup takes at most this share of the first one's (README_GAUDI.md,
# "Warm restarts"; measured 18 %).
RESTART_SHARE = 0.25


# Minutes even for four buckets (inductor's C++ compile): make test-long runs it.
@pytest.mark.warm_restart
def test_a_restart_loads_every_graph_from_the_cache(tmp_path):
    args = startup.parse_args(RESTART_ARGS)
    env = {"VLLM_HPU_CACHE_DIR": str(tmp_path / "hpu")}
    starts = []
    for i in range(2):
        # An empty inductor cache of its own each time, as a new pod has.
        inductor = str(tmp_path / f"inductor-{i}")
        starts.append(
            startup.run_child(args, False, TORCHINDUCTOR_CACHE_DIR=inductor, **env)
        )
    first, second = starts
    assert first["graphs_reused"] == 0 and first["graphs_compiled"] > 0
    assert second["graphs_reused"] == first["graphs_compiled"]
    assert second["graphs_compiled"] == 0
    assert second["warmup_s"] <= first["warmup_s"] * RESTART_SHARE
    reused = f"{first['graphs_compiled']} of {first['graphs_compiled']} graphs came"
    assert any(reused in line for line in second["cache_log"])
    assert (tmp_path / "hpu").is_dir()


# KV cache bytes for 8 blocks of 16 tokens of tiny-llama (2 layers x K and V x
# 2 KV heads of 64 x 16 tokens, float32: 32 KiB a block).
SMALL_KV = dict(
    block_size=16,
    max_model_len=32,
    max_num_seqs=64,
    max_num_batched_tokens=64,
    enable_prefix_caching=False,
    kv_cache_memory_bytes=8 * 32 << 10,
)


def decode_buckets_logged(messages: list[str]) -> list[tuple[int, int]]:
    (line,) = [m for m in messages if " decode buckets: [" in m]
    return ast.literal_eval(line.split(": ", 1)[1])


def test_a_small_kv_cache_and_no_graph_memory_start_and_serve(hpu_env, vllm_log):
    """max_num_seqs 64 with 8 KV blocks: no decode bucket holds more blocks than
    the cache or a batch only more than 8 sequences pad to; the emulated device
    has nothing free for graphs, so every bucket is left out of capture, said in
    one line, and still serves."""
    hpu_env(VLLM_HPU_COMPILE_BACKEND="eager", VLLM_HPU_EMULATION_MEMORY_GB="0.001")
    prompts = random_prompts([5, 9, 12], 1024, seed=1)
    with vllm_engine(model_path("tiny-llama"), enforce_eager=False, **SMALL_KV) as llm:
        tokens = vllm_greedy(llm, prompts, 4)
    assert tokens == hf_greedy(model_path("tiny-llama"), prompts, 4, torch.float32)
    messages = vllm_log.messages()
    assert "# HPU blocks: 8, # CPU blocks: 0" in messages
    decode = decode_buckets_logged(messages)
    batch_sizes = sorted({bs for bs, _ in decode})
    assert max(blocks for _, blocks in decode) <= 8
    # The largest batch size is one that a batch of at most 8 sequences pads to.
    assert len(batch_sizes) < 2 or batch_sizes[-2] < 8
    assert any(m.startswith("[Warmup][Decode]") for m in messages)
    left_out = [m for m in messages if "left out of graph capture" in m]
    assert len(left_out) == 1
    assert re.match(r"(\d+) of \1 buckets were left out", left_out[0])
    assert "raise VLLM_GRAPH_RESERVED_MEM" in left_out[0]
    assert not any(m.startswith("[Warmup][Graph/") for m in messages)
