"""Op timings on the CPU against naive loops. Decode attention: flat paged attention
vs gathering each sequence's tokens (batch 64, context 1024, block 128, 32 heads,
8 kv heads, head size 128), and the same batch verifying 3 drafts per row at a
context that leaves the last block part-filled (its hidden keys cost the CPU's
exp its slow underflow path unless floored: ops/paged_attention.py). MoE: a
Mixtral-like layer (8 experts, top 2, 64 tokens) routed and run by ops/moe.py vs
a per-token loop over its chosen experts.
Quantized linear: each checkpoint format's dequantize-and-multiply (AWQ, GPTQ,
online fp8, and the kernels vLLM selects for fp8, block fp8, int8 W8A8, WNA16 and
MXFP4 checkpoints) vs the unquantized linear.
Quantized MoE: each format's experts dequantized and run, vs bf16 experts.
Encoder attention: peak memory of one Qwen2-VL-like layer over an 8k-patch pass,
whole (one [P, P] mask) vs in tiles.
Run: python benchmarks/ops.py [--dtype bf16] [--op attention|moe|quant|quant-moe|
    encoder]
"""

import argparse
import multiprocessing
import random
import resource
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import torch
import torch.nn.functional as F
from vllm.config import (
    CompilationConfig,
    CompilationMode,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.model_executor.kernels.linear import (
    FP8ScaledMMLinearLayerConfig,
    Int8ScaledMMLinearLayerConfig,
    MPLinearLayerConfig,
    MxFp4LinearLayerConfig,
)
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    GroupShape,
    QuantKey,
    create_fp8_quant_key,
    kFp8DynamicTokenSym,
    kFp8StaticChannelSym,
)
from vllm.scalar_type import scalar_types

from benchmarks.moe_quant import quantized_moe_calls
from vllm_hpu.attention.metadata import CacheGeometry, SeqLayout, build_decode_metadata
from vllm_hpu.attention.verify import pack_rows
from vllm_hpu.envs import SLICE_THRESHOLD
from vllm_hpu.ops.encoder_attention import encoder_attention
from vllm_hpu.ops.kv_cache import allocate_kv_cache, gather_blocks
from vllm_hpu.ops.moe import MoeRouting, experts_dense, fused_experts, select_experts
from vllm_hpu.ops.paged_attention import paged_attention
from vllm_hpu.ops.score_mods import Scoring
from vllm_hpu.ops.sliced_attention import NO_SLICING, PromptSlicing
from vllm_hpu.quantization import dequant
from vllm_hpu.quantization.fp8 import (
    HpuFp8BlockScaledMMLinearKernel,
    HpuFp8ScaledMMLinearKernel,
    fp8_linear,
    quantize_per_tensor,
)
from vllm_hpu.quantization.int8 import HpuInt8ScaledMMLinearKernel
from vllm_hpu.quantization.mxfp4 import HpuMxfp4LinearKernel
from vllm_hpu.quantization.wna16 import HpuWNA16LinearKernel

BATCH_SIZE, CONTEXT, BLOCK_SIZE = 64, 1024, 128
# Verification: each row's last sampled token and its drafts, 60 slots short
# of a full last block.
NUM_QUERIES, VERIFY_CONTEXT = 4, 960
NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE = 32, 8, 128
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# Mixtral's 8 experts, top 2 and hidden:intermediate ratio, at a quarter of its
# hidden size so that the weights (350 MB in float32) suit a CPU.
NUM_TOKENS, MOE_HIDDEN, MOE_INTERMEDIATE, NUM_EXPERTS, TOP_K = 64, 1024, 3584, 8, 2
# A Qwen2-VL vision tower's attention (16 heads of 80) over one 8k-patch pass.
ENCODER_PATCHES, ENCODER_HEADS, ENCODER_HEAD_SIZE = 8192, 16, 80
# A Llama-3-8B attention projection (4096 x 4096), groups of 128, one decode batch.
LINEAR_TOKENS, LINEAR_IN, LINEAR_OUT, GROUP_SIZE = 32, 4096, 4096, 128


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


def measure_interleaved(
    fns: list[Callable[[], torch.Tensor]], iters: int
) -> list[float]:
    """Fastest seconds per call of each, the calls taking turns: on a shared CPU,
    load only ever adds time, and turns spread it over all of them alike."""
    best = [float("inf")] * len(fns)
    for _ in range(iters + 1):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def naive_moe(
    x: torch.Tensor, logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor
) -> torch.Tensor:
    """Per token: softmax, top 2 renormalised, each chosen expert in turn."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        weights, ids = torch.softmax(logits[t].float(), -1).topk(TOP_K)
        for weight, expert in zip(weights / weights.sum(), ids.tolist(), strict=True):
            gate, up = (x[t] @ w13[expert].t()).chunk(2)
            out[t] += weight.to(x.dtype) * ((F.silu(gate) * up) @ w2[expert].t())
    return out


def time_moe(name: str, dtype: torch.dtype, iters: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(NUM_TOKENS, MOE_HIDDEN).to(dtype)
    logits = torch.randn(NUM_TOKENS, NUM_EXPERTS)
    w13 = (torch.randn(NUM_EXPERTS, 2 * MOE_INTERMEDIATE, MOE_HIDDEN) * 0.02).to(dtype)
    w2 = (torch.randn(NUM_EXPERTS, MOE_HIDDEN, MOE_INTERMEDIATE) * 0.02).to(dtype)
    routing = MoeRouting(TOP_K, renormalize=True)

    def routed(experts: Callable[..., torch.Tensor]) -> torch.Tensor:
        weights, ids = select_experts(x, logits, routing)
        return experts(x, w13, w2, weights, ids)

    chosen, dense, naive = measure_interleaved(
        [
            lambda: routed(fused_experts),
            lambda: routed(experts_dense),
            lambda: naive_moe(x, logits, w13, w2),
        ],
        iters,
    )
    print(
        f"MoE, {name}, {NUM_TOKENS} tokens, {NUM_EXPERTS} experts, top {TOP_K}, "
        f"hidden {MOE_HIDDEN}, intermediate {MOE_INTERMEDIATE}, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"token-to-expert (chosen): {chosen * 1e3:8.2f} ms")
    print(f"dense, every expert     : {dense * 1e3:8.2f} ms")
    print(f"naive per-token loop    : {naive * 1e3:8.2f} ms")
    print(f"naive / chosen          : {naive / chosen:8.2f}x")


def time_quantized_moe(name: str, dtype: torch.dtype, iters: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(NUM_TOKENS, MOE_HIDDEN).to(dtype)
    logits = torch.randn(NUM_TOKENS, NUM_EXPERTS)
    calls = quantized_moe_calls(x, logits, TOP_K, MOE_INTERMEDIATE)
    seconds = measure_interleaved(list(calls.values()), iters)
    times = dict(zip(calls, seconds, strict=True))
    print(
        f"quantized MoE, {name} activations, {NUM_TOKENS} tokens, {NUM_EXPERTS} "
        f"experts, top {TOP_K}, hidden {MOE_HIDDEN}, intermediate {MOE_INTERMEDIATE}"
    )
    for label, took in times.items():
        ratio = took / times["unquantized"]
        print(f"{label:38s}: {took * 1e3:8.2f} ms ({ratio:.1f}x)")


def time_quantized_linear(name: str, dtype: torch.dtype, iters: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(LINEAR_TOKENS, LINEAR_IN).to(dtype)
    weight = (torch.randn(LINEAR_OUT, LINEAR_IN) * 0.02).to(dtype)
    groups = LINEAR_IN // GROUP_SIZE
    words = torch.randint(-(2**31), 2**31 - 1, (LINEAR_IN, LINEAR_OUT // 8))
    awq_zeros = words[:groups].to(torch.int32)
    gptq_weight = words.to(torch.int32).view(LINEAR_IN // 8, LINEAR_OUT)
    scales = (torch.rand(groups, LINEAR_OUT) * 1e-3).to(dtype)
    fp8_weight, fp8_scale = quantize_per_tensor(weight)
    awq_weight = words.to(torch.int32)
    cases = {
        f"{name} linear": lambda: F.linear(x, weight),
        "AWQ dequant + matmul": lambda: (
            x @ dequant.dequantize_awq(awq_weight, awq_zeros, scales)
        ),
        "GPTQ dequant + matmul": lambda: (
            x @ dequant.dequantize_gptq(gptq_weight, awq_zeros, scales, None)
        ),
        "online fp8 (per tensor)": lambda: fp8_linear(x, fp8_weight, fp8_scale),
    }
    compilation = CompilationConfig(mode=CompilationMode.NONE, custom_ops=["all"])
    with set_current_vllm_config(VllmConfig(compilation_config=compilation)):
        cases |= checkpoint_kernels(x, weight)
        times = measure_interleaved(list(cases.values()), iters)
    print(
        f"quantized linear, {name}, {LINEAR_TOKENS} tokens, {LINEAR_IN} -> "
        f"{LINEAR_OUT}, group {GROUP_SIZE}, {torch.get_num_threads()} threads"
    )
    for label, seconds in zip(cases, times, strict=True):
        print(f"{label:34}: {seconds * 1e3:8.2f} ms ({seconds / times[0]:.1f}x)")


def _layer(**tensors: torch.Tensor | None) -> torch.nn.Module:
    module = torch.nn.Module()
    for name, tensor in tensors.items():
        setattr(module, name, tensor)
    return module


def checkpoint_kernels(
    x: torch.Tensor, weight: torch.Tensor
) -> dict[str, Callable[[], torch.Tensor]]:
    """The kernels vLLM selects for checkpoints on the plugin, each on the same
    layer as its checkpoint format stores it (random codes and scales)."""
    n, k = weight.shape
    fp8_params = ["weight", "weight_scale", "input_scale", "input_scale_ub"]
    fp8 = HpuFp8ScaledMMLinearKernel(
        _fp8_config(kFp8DynamicTokenSym, kFp8StaticChannelSym, (n, k)), fp8_params
    )
    channel = _layer(
        weight=weight.to(torch.float8_e4m3fn).t(), weight_scale=torch.ones(n, 1)
    )
    block = HpuFp8BlockScaledMMLinearKernel(
        _fp8_config(
            create_fp8_quant_key(static=False, group_shape=GroupShape(1, 128)),
            create_fp8_quant_key(static=True, group_shape=GroupShape(128, 128)),
            (n, k),
        )
    )
    blocks = _layer(
        weight=weight.to(torch.float8_e4m3fn),
        weight_scale_inv=torch.ones(n // 128, k // 128),
    )
    int8_params = ["weight", "weight_scale", "input_scale", "input_zero_point", "azp"]
    int8 = HpuInt8ScaledMMLinearKernel(
        Int8ScaledMMLinearLayerConfig(False, True, True), int8_params
    )
    int8_layer = _layer(
        weight=torch.randint(-127, 128, (n, k), dtype=torch.int8).t(),
        weight_scale=torch.full((n, 1), 1e-3),
    )
    wna16 = HpuWNA16LinearKernel(
        MPLinearLayerConfig(
            (k, n), (k, n), scalar_types.uint4b8, x.dtype, GROUP_SIZE, False
        ),
        "weight_packed",
        "weight_scale",
    )
    packed = _layer(
        weight_packed=torch.randint(
            -(2**31), 2**31 - 1, (n, k // 8), dtype=torch.int32
        ),
        weight_scale=torch.full((n, k // GROUP_SIZE), 1e-3, dtype=x.dtype),
    )
    mxfp4 = HpuMxfp4LinearKernel(MxFp4LinearLayerConfig())
    codes = _layer(
        weight=torch.randint(0, 256, (n, k // 2), dtype=torch.uint8),
        weight_scale=torch.randint(117, 123, (n, k // 32), dtype=torch.uint8),
    )
    return {
        "fp8 W8A8 (channel, dynamic token)": lambda: fp8.apply_weights(channel, x),
        "fp8 block 128x128 (W8A8)": lambda: block.apply_weights(blocks, x),
        "int8 W8A8 (channel, dynamic token)": lambda: int8.apply_weights(int8_layer, x),
        f"WNA16 int4 (group {GROUP_SIZE})": lambda: wna16.apply_weights(packed, x),
        "MXFP4-A16": lambda: mxfp4.apply_weights(codes, x),
    }


def _fp8_config(
    act_key: QuantKey, weight_key: QuantKey, shape: tuple[int, int]
) -> FP8ScaledMMLinearLayerConfig:
    dtype = torch.get_default_dtype()
    return FP8ScaledMMLinearLayerConfig(weight_key, act_key, shape, dtype, dtype)


def time_attention(name: str, dtype: torch.dtype, iters: int) -> None:
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
        iters,
    )
    naive = measure(
        lambda: naive_decode(query, key_cache, value_cache, id_tables, scale),
        iters,
    )
    print(
        f"decode attention, {name}, batch {BATCH_SIZE}, context {CONTEXT}, "
        f"block {BLOCK_SIZE}, heads {NUM_HEADS}/{NUM_KV_HEADS}, head size {HEAD_SIZE}, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"flat paged attention : {flat * 1e3:8.2f} ms")
    print(f"naive gather + attend: {naive * 1e3:8.2f} ms")
    print(f"naive / flat         : {naive / flat:8.2f}x")
    verify = measure(verify_attention(tables, key_cache, value_cache, geometry), iters)
    print(
        f"verification, {NUM_QUERIES} queries per row at context {VERIFY_CONTEXT}: "
        f"{verify * 1e3:8.2f} ms"
    )


def verify_attention(
    tables: list[list[int]],
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    geometry: CacheGeometry,
) -> Callable[[], torch.Tensor]:
    """One verification pass's attention: every row's NUM_QUERIES tokens after
    VERIFY_CONTEXT cached ones, causal among them."""
    seqs = [SeqLayout(t, VERIFY_CONTEXT, NUM_QUERIES) for t in tables]
    starts = pack_rows([NUM_QUERIES] * len(seqs), NUM_QUERIES)
    blocks = build_decode_metadata(
        seqs, len(seqs), geometry.num_blocks, geometry, starts, NUM_QUERIES
    ).decode_blocks()
    query = torch.randn(len(seqs) * NUM_QUERIES, NUM_HEADS, HEAD_SIZE)
    query = query.to(key_cache.dtype)
    scoring = Scoring(HEAD_SIZE**-0.5)
    return lambda: paged_attention(query, key_cache, value_cache, blocks, scoring)


def encoder_pass_peak(
    slicing: PromptSlicing, dtype: torch.dtype
) -> tuple[float, float]:
    """(peak resident MiB added, seconds) of one encoder attention layer over an
    ENCODER_PATCHES pass of 1k-patch images; run in a fresh process, so the
    process's high-water mark is this pass's."""
    gen = torch.Generator().manual_seed(0)
    shape = (1, ENCODER_PATCHES, ENCODER_HEADS, ENCODER_HEAD_SIZE)
    q, k, v = (torch.randn(shape, generator=gen).to(dtype) for _ in range(3))
    ends = list(range(0, ENCODER_PATCHES + 1, 1024))
    cu_seqlens = torch.tensor(ends, dtype=torch.int32)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    encoder_attention(q, k, v, ENCODER_HEAD_SIZE**-0.5, cu_seqlens, slicing)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return (after - before) / 1024, seconds


def time_encoder(name: str, dtype: torch.dtype, iters: int) -> None:
    """Peak memory of one encoder layer's attention, whole pass vs tiles."""
    cases = {
        "whole pass ([P, P] mask)": NO_SLICING,
        "tiles (env defaults)": PromptSlicing(SLICE_THRESHOLD, SLICE_THRESHOLD // 2),
    }
    print(
        f"encoder attention, {name}, {ENCODER_PATCHES} patches (1k per image), "
        f"{ENCODER_HEADS} heads x {ENCODER_HEAD_SIZE}"
    )
    spawn = multiprocessing.get_context("spawn")
    for label, slicing in cases.items():
        with ProcessPoolExecutor(1, mp_context=spawn) as pool:
            peak, seconds = pool.submit(encoder_pass_peak, slicing, dtype).result()
        print(f"{label:26}: peak +{peak:8.0f} MiB, {seconds * 1e3:8.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--iters", type=int, default=10)
    ops = ["attention", "moe", "quant", "quant-moe", "encoder", "all"]
    parser.add_argument("--op", choices=ops, default="all")
    args = parser.parse_args()
    if args.op in ("moe", "all"):
        time_moe(args.dtype, DTYPES[args.dtype], args.iters)
    if args.op in ("quant", "all"):
        time_quantized_linear(args.dtype, DTYPES[args.dtype], args.iters)
    if args.op in ("quant-moe", "all"):
        time_quantized_moe(args.dtype, DTYPES[args.dtype], args.iters)
    if args.op in ("attention", "all"):
        time_attention(args.dtype, DTYPES[args.dtype], args.iters)
    if args.op in ("encoder", "all"):
        time_encoder(args.dtype, DTYPES[args.dtype], args.iters)


if __name__ == "__main__":
    main()
