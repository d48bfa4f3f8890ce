"""Peak host memory of one flat decode step over hundreds of thousands of KV
blocks (issue 38): the metadata (block_mapping [P, bs], block_bias [P, B]) and
the attention of one layer, all blocks at once and a slice at a time
(VLLM_HPU_DECODE_BLOCK_SLICE), against the bytes of the batch's keys and values.

The tiny long-context models' head (1 KV head of 64, float32), 16-token blocks so
that P = 200,000 blocks (64 sequences of 50,000 tokens) fits a host. Each run is
a fresh process: the peak resident set (VmHWM) is reset once the KV cache
exists, so the figure is the step's own.

    python -m benchmarks.long_decode_memory [--blocks-per-seq 3125]
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from vllm_hpu.attention.metadata import CacheGeometry, SeqLayout, build_decode_metadata
from vllm_hpu.ops.paged_attention import ALL_BLOCKS, paged_attention
from vllm_hpu.ops.score_mods import Scoring

BATCH, HEADS, KV_HEADS, HEAD_SIZE, BLOCK = 64, 1, 1, 64, 16
SLICE = 4096
MiB = 1 << 20


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def child(blocks_per_seq: int, block_slice: int) -> dict[str, float]:
    num_blocks = BATCH * blocks_per_seq
    slots = (num_blocks + 1) * BLOCK
    caches = [torch.randn(slots, KV_HEADS, HEAD_SIZE) for _ in "kv"]
    query = torch.randn(BATCH, HEADS, HEAD_SIZE)
    seqs = [
        SeqLayout(
            list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)),
            blocks_per_seq * BLOCK - 1,
            1,
        )
        for i in range(BATCH)
    ]
    cache = CacheGeometry(BLOCK, num_blocks, torch.float32, torch.device("cpu"))
    at_rest = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to VmRSS
    started = time.perf_counter()
    blocks = build_decode_metadata(seqs, BATCH, num_blocks, cache).decode_blocks()
    built = time.perf_counter()
    paged_attention(
        query, *caches, blocks, Scoring(HEAD_SIZE**-0.5), block_slice=block_slice
    )
    done = time.perf_counter()
    return {
        "peak_mib": (_status_kib("VmHWM") - at_rest) / 1024,
        "metadata_s": built - started,
        "attention_s": done - built,
    }


def run(blocks_per_seq: int, block_slice: int) -> dict[str, float]:
    command = [sys.executable, "-m", "benchmarks.long_decode_memory", "--child"]
    done = subprocess.run(
        [*command, str(blocks_per_seq), str(block_slice)],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks-per-seq", type=int, default=3125)
    parser.add_argument("--child", type=int, nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(*args.child)))
        return
    num_blocks = BATCH * args.blocks_per_seq
    kv = num_blocks * BLOCK * KV_HEADS * HEAD_SIZE * 4 * 2 / MiB
    mapping = num_blocks * BATCH * 4 / MiB
    bias = num_blocks * BLOCK * 4 / MiB
    print(
        f"P = {num_blocks} blocks ({BATCH} sequences of "
        f"{args.blocks_per_seq * BLOCK} tokens): keys and values of the batch "
        f"{kv:.0f} MiB, block_mapping {mapping:.0f} MiB, block_bias {bias:.0f} MiB"
    )
    print("| blocks read at a time | peak above rest | metadata | attention |")
    print("|---|---|---|---|")
    for block_slice in (ALL_BLOCKS, SLICE):
        result = run(args.blocks_per_seq, block_slice)
        label = "all" if block_slice == ALL_BLOCKS else str(block_slice)
        print(
            f"| {label} | {result['peak_mib']:.0f} MiB | "
            f"{result['metadata_s']:.2f} s | {result['attention_s']:.2f} s |",
            flush=True,
        )


if __name__ == "__main__":
    main()
