"""One MLA prompt chunk after cached context, through the plugin's MLA layer impl.

A DeepSeek-V2(-Lite) attention layer (16 heads, 512-wide latent, rope 64, nope
and value heads 128), one 128-token chunk after 0, 1k, 4k and 16k cached tokens
(block 128). Prints the chunk's time, the rows ``kv_b_proj`` expanded and the
time spent in it, and the rest (attention over the context, gathers, merges):
the projection should stay flat in the context, the rest grow linearly.

Run: python -m benchmarks.mla_chunks [--dtype bf16] [--iters 3]
"""

import argparse
import time

import torch

from vllm_hpu.attention.metadata import (
    CacheGeometry,
    SeqLayout,
    build_prompt_metadata,
)
from vllm_hpu.attention.mla import HpuMLAImpl
from vllm_hpu.ops.mla_kernels import allocate_latent_cache

NUM_HEADS, KV_LORA_RANK, ROPE, NOPE, V_HEAD = 16, 512, 64, 128, 128
CHUNK, BLOCK_SIZE = 128, 128
CONTEXTS = (0, 1024, 4096, 16384)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class CountingKvBProj(torch.nn.Module):
    """kv_b_proj as vLLM's unquantized linear layers look to the impl
    (``weight`` [N * (P + V), L], ``quant_method`` None, returns (out, bias)),
    counting the rows it expands and the time it takes."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.quant_method = None
        self.rows = 0
        self.seconds = 0.0

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        start = time.perf_counter()
        out = x @ self.weight.t()
        self.seconds += time.perf_counter() - start
        self.rows += x.shape[0]
        return out, None


def make_impl(dtype: torch.dtype) -> tuple[HpuMLAImpl, CountingKvBProj]:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(NUM_HEADS * (NOPE + V_HEAD), KV_LORA_RANK, generator=gen) * (
        KV_LORA_RANK**-0.5
    )
    kv_b_proj = CountingKvBProj(weight.to(dtype))
    impl = HpuMLAImpl(
        num_heads=NUM_HEADS,
        head_size=KV_LORA_RANK + ROPE,
        scale=(NOPE + ROPE) ** -0.5,
        num_kv_heads=1,
        alibi_slopes=None,
        sliding_window=None,
        kv_cache_dtype="auto",
        logits_soft_cap=None,
        attn_type="decoder",
        kv_sharing_target_layer_name=None,
        kv_lora_rank=KV_LORA_RANK,
        kv_b_proj=kv_b_proj,
        qk_nope_head_dim=NOPE,
        v_head_dim=V_HEAD,
    )
    impl.process_weights_after_loading(dtype)
    return impl, kv_b_proj


def time_chunk(context: int, dtype: torch.dtype, iters: int) -> tuple[float, ...]:
    """(chunk seconds, kv_b_proj rows, kv_b_proj seconds) per call, the fastest."""
    impl, kv_b_proj = make_impl(dtype)
    num_blocks = (context + CHUNK) // BLOCK_SIZE
    cpu = torch.device("cpu")
    cache = allocate_latent_cache(
        num_blocks, BLOCK_SIZE, KV_LORA_RANK + ROPE, dtype, cpu
    )
    cache.normal_()
    seq = SeqLayout(list(range(num_blocks)), context, CHUNK)
    geometry = CacheGeometry(BLOCK_SIZE, num_blocks, dtype, cpu)
    metadata = build_prompt_metadata([seq], 1, CHUNK, context // BLOCK_SIZE, geometry)
    q = torch.randn(CHUNK, NUM_HEADS, NOPE + ROPE, dtype=dtype)
    kv_c, k_pe = (
        torch.randn(CHUNK, KV_LORA_RANK, dtype=dtype),
        torch.randn(CHUNK, 1, ROPE, dtype=dtype),
    )
    output = torch.empty(CHUNK, NUM_HEADS * V_HEAD, dtype=dtype)
    scale = torch.ones(())
    best = (float("inf"), 0.0, 0.0)
    for _ in range(iters + 1):
        kv_b_proj.rows, kv_b_proj.seconds = 0, 0.0
        start = time.perf_counter()
        impl.forward_mha(q, kv_c, k_pe, cache, metadata, scale, output)
        elapsed = time.perf_counter() - start
        if elapsed < best[0]:
            best = (elapsed, kv_b_proj.rows, kv_b_proj.seconds)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp32")
    parser.add_argument("--iters", type=int, default=3)
    args = parser.parse_args()
    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)
    print(
        f"MLA chunk of {CHUNK} tokens, {NUM_HEADS} heads, latent {KV_LORA_RANK}"
        f"+{ROPE}, {args.dtype}, {torch.get_num_threads()} threads"
    )
    print("context | chunk ms | kv_b_proj rows | kv_b_proj ms | rest ms")
    for context in CONTEXTS:
        total, rows, proj = time_chunk(context, dtype, args.iters)
        print(
            f"{context:7d} | {total * 1e3:8.1f} | {int(rows):14d} | "
            f"{proj * 1e3:12.1f} | {(total - proj) * 1e3:7.1f}"
        )


if __name__ == "__main__":
    main()
