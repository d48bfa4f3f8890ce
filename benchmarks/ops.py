"""Decode-attention timing on the CPU: flat paged attention vs a naive loop that
gathers each sequence's tokens and attends (batch 64, context 1024, block 128,
32 heads, 8 kv heads, head size 128). Run: python benchmarks/ops.py [--dtype bf16]
"""

import argparse
import random
import time
from collections.abc import Callable

import torch

from vllm_hpu.attention.metadata import CacheGeometry, SeqLayout, build_decode_metadata
from vllm_hpu.ops.kv_cache import allocate_kv_cache, gather_blocks
from vllm_hpu.ops.paged_attention import paged_attention
from vllm_hpu.ops.score_mods import Scoring

BATCH_SIZE, CONTEXT, BLOCK_SIZE = 64, 1024, 128
NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE = 32, 8, 128
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def naive_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    tables: list[torch.Tensor],
    scale: float,
) -> torch.Tensor:
    """Per sequence: gather its blocks, repeat K/V for the groups, softmax."""
    group = NUM_HEADS // NUM_KV_HEADS
    outputs = []
    for i, table in enumerate(tables):
        keys = gather_blocks(key_cache, table, BLOCK_SIZE).flatten(0, 1)
        values = gather_blocks(value_cache, table, BLOCK_SIZE).flatten(0, 1)
        keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # [H, L, D]
        values = values.repeat_interleave(group, dim=1).transpose(0, 1)
        scores = torch.matmul(query[i].unsqueeze(1) * scale, keys.transpose(1, 2))
        probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
        outputs.append(torch.matmul(probs, values).squeeze(1))
    return torch.stack(outputs)


def measure(fn: Callable[[], torch.Tensor], iters: int) -> float:
    """Median seconds per call after one warm-up call."""
    fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)
    blocks_per_seq = CONTEXT // BLOCK_SIZE
    num_blocks = BATCH_SIZE * blocks_per_seq
    ids = list(range(num_blocks))
    random.Random(0).shuffle(ids)
    tables = [
        ids[i * blocks_per_seq : (i + 1) * blocks_per_seq] for i in range(BATCH_SIZE)
    ]
    key_cache, value_cache = allocate_kv_cache(
        num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE, dtype, torch.device("cpu")
    )
    key_cache.normal_()
    value_cache.normal_()
    query = torch.randn(BATCH_SIZE, NUM_HEADS, HEAD_SIZE).to(dtype)
    scale = HEAD_SIZE**-0.5
    geometry = CacheGeometry(BLOCK_SIZE, num_blocks, dtype, torch.device("cpu"))
    seqs = [SeqLayout(t, CONTEXT - 1, 1) for t in tables]
    blocks = build_decode_metadata(
        seqs, BATCH_SIZE, num_blocks, geometry
    ).decode_blocks()
    id_tables = [torch.tensor(t) for t in tables]

    flat = measure(
        lambda: paged_attention(query, key_cache, value_cache, blocks, Scoring(scale)),
        args.iters,
    )
    naive = measure(
        lambda: naive_decode(query, key_cache, value_cache, id_tables, scale),
        args.iters,
    )
    print(
        f"decode attention, {args.dtype}, batch {BATCH_SIZE}, context {CONTEXT}, "
        f"block {BLOCK_SIZE}, heads {NUM_HEADS}/{NUM_KV_HEADS}, head size {HEAD_SIZE}, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"flat paged attention : {flat * 1e3:8.2f} ms")
    print(f"naive gather + attend: {naive * 1e3:8.2f} ms")
    print(f"naive / flat         : {naive / flat:8.2f}x")


if __name__ == "__main__":
    main()
