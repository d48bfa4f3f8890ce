"""KV offloading to host memory (--kv-offloading-size) through the plugin's spec.

A device cache of 24 blocks serves six prompts whose prefixes take 36: by the
time a prefix comes back, the device has evicted it, and its blocks come back
from host memory. The outputs equal those of a device cache that holds
everything (tiny-llama, greedy, float32). The offloading engine runs as a user
runs it, through vLLM's default engine (its core in a process of its own, which
runs the config hooks a second time: issue 50's hang); the large cache runs
in this process. In the offloading engine's process every copy is checked:
stored blocks equal the device blocks they came from, and a load overwrites
its device blocks before it brings theirs back.
"""

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from models import model_path

from e2e.harness import default_engine, vllm_engine

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


def generate(engine: Callable = vllm_engine, **engine_args) -> dict[str, Any]:
    """Greedy tokens of each prompt sent one by one, counters summed by name,
    the number of device KV blocks, and, where the copier was checked, what
    the checks found."""
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    checked = "kv_offloading_size" in engine_args
    with engine(
        str(model_path(MODEL)),
        block_size=BLOCK_SIZE,
        max_model_len=256,
        enforce_eager=True,
        **engine_args,
    ) as llm:
        if checked:
            llm.collective_rpc(check_copies)
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
        return {
            "outputs": outputs,
            "counters": counters,
            "num_blocks": llm.llm_engine.vllm_config.cache_config.num_gpu_blocks,
            "copies": llm.collective_rpc(copies_seen)[0] if checked else None,
        }


# In the engine's process (collective_rpc): every copy of the plugin's copier
# checked against the blocks it moved, byte for byte. A load's device blocks are
# overwritten first (with 0x7f bytes: float32 3.4e38), so only what the copy
# brings back from host memory can make the outputs right, whatever an evicted
# block still held.
POISON = 0x7F
COPIES = {"stored": 0, "loaded": 0, "unequal": 0}


def check_copies(worker: Any) -> None:
    from vllm_hpu.kv_transfer import offloading

    copy = offloading.HostBlockCopier._copy

    def checked(copier: Any, job_id: int, device_spec, host_spec, to_host: bool):
        pairs = _block_pairs(copier, device_spec, host_spec)
        if not to_host:
            for device_run, blocks, _, _ in pairs:
                device_run[blocks] = POISON
        copy(copier, job_id, device_spec, host_spec, to_host)
        for device_run, blocks, host_run, rows in pairs:
            COPIES["unequal"] += not torch.equal(device_run[blocks], host_run[rows])
        COPIES["stored" if to_host else "loaded"] += len(device_spec.block_ids)

    offloading.HostBlockCopier._copy = checked


def _block_pairs(copier: Any, device_spec, host_spec) -> list[tuple]:
    """(device run, its blocks, host run, their rows) of each cache tensor a
    copy moves, as the copier pairs them."""
    from vllm_hpu.kv_transfer.offloading import host_rows

    rows = host_rows(host_spec.block_ids, device_spec, copier.blocks_per_chunk)
    device_ids = torch.from_numpy(device_spec.block_ids.astype(np.int64))
    pairs, start = [], 0
    for tensor_ids, size in zip(
        copier.group_tensor_ids, device_spec.group_sizes, strict=True
    ):
        blocks = device_ids[start : start + size]
        host_ids = torch.from_numpy(rows[start : start + size])
        pairs += [
            (copier.device_runs[i], blocks, copier.host_runs[i], host_ids)
            for i in tensor_ids
        ]
        start += size
    return pairs


def copies_seen(worker: Any) -> dict[str, int]:
    return dict(COPIES)


def test_kv_offloading_serves_evicted_prefixes_from_host() -> None:
    expected = generate()["outputs"]
    offloaded = generate(
        default_engine,  # vLLM's default: the core in a process of its own
        kv_cache_memory_bytes=DEVICE_BLOCKS * BLOCK_BYTES,
        kv_offloading_size=0.01,
        enable_prefix_caching=True,
    )
    assert offloaded["num_blocks"] == DEVICE_BLOCKS
    assert offloaded["outputs"] == expected
    # Whole prefixes went to host memory and came back from it (prefix hits
    # the scheduler found there), every block equal to the one it came from.
    copies, counters = offloaded["copies"], offloaded["counters"]
    hits = counters["vllm:external_prefix_cache_hits"]
    assert hits >= (NUM_PREFIXES - 1) * PREFIX_BLOCKS * BLOCK_SIZE
    assert copies["stored"] >= NUM_PREFIXES * PREFIX_BLOCKS
    assert copies["loaded"] == hits // BLOCK_SIZE
    assert copies["unequal"] == 0
    assert counters["vllm:kv_offload_load_bytes"] == copies["loaded"] * BLOCK_BYTES
