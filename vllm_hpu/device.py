"""The single seam between the plugin and Gaudi hardware.

Only this module imports ``habana_frameworks`` or touches ``torch.hpu``. Every
function has a CPU-emulation counterpart, so the rest of the plugin runs the same
code paths on Gaudi and on a ``cpu`` torch device.
"""

import functools
import importlib
import importlib.metadata
import importlib.util
from collections.abc import Callable
from typing import Any

import torch

from vllm_hpu import envs
from vllm_hpu.emulation import device_memory
from vllm_hpu.emulation.device_stream import DeviceStream
from vllm_hpu.envs import get_envs

GiB = 1 << 30


@functools.cache
def hpu_available() -> bool:
    """True when the Habana bridge imports and reports at least one device."""
    if importlib.util.find_spec("habana_frameworks") is None:
        return False
    try:
        _set_up_recipe_cache()
        importlib.import_module("habana_frameworks.torch")
        return bool(torch.hpu.is_available()) and torch.hpu.device_count() > 0  # type: ignore[attr-defined]
    except Exception:  # a broken bridge install means: no Gaudi here
        return False


# Gaudi's recipe cache: folder, whether to empty it at start, size limit in MB.
RECIPE_CACHE_MB = 8192


def _set_up_recipe_cache() -> None:
    """With VLLM_HPU_CACHE_DIR, the bridge keeps its compiled recipes there (per
    plugin version); recipes are found by their graph's hash, so a changed
    model, dtype or bucket compiles a recipe of its own."""
    folder = get_envs().cache_dir
    if folder:
        recipes = f"{folder}/gaudi-recipes-{importlib.metadata.version('vllm-hpu')}"
        envs.set_default(
            "PT_HPU_RECIPE_CACHE_CONFIG", f"{recipes},False,{RECIPE_CACHE_MB}"
        )


def is_emulation() -> bool:
    """True when the plugin runs on the CPU because emulation was asked for."""
    return not hpu_available() and get_envs().emulation


def device_type() -> str:
    return "hpu" if hpu_available() else "cpu"


@functools.cache
def cpu_has_bf16_instructions() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX-512 BF16 or AMX tiles): there
    oneDNN runs packed bf16 linear layers; elsewhere bf16 matmuls run unpacked,
    several times slower than float32 (``emulation/packed_linear.py``)."""
    return bool(
        torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    )


def fast_dtype() -> torch.dtype:
    """The dtype this device runs models fastest in: bf16 on Gaudi and on a CPU
    with bf16 instructions, float32 on other CPUs."""
    if hpu_available() or cpu_has_bf16_instructions():
        return torch.bfloat16
    return torch.float32


def dist_backend() -> str:
    return "hccl" if hpu_available() else "gloo"


def local_device(named: torch.device) -> torch.device:
    """Where a device vLLM named after the platform ("hpu:<rank>") really is:
    itself on Gaudi, the CPU in emulation."""
    return named if hpu_available() else torch.device("cpu")


def compile_backend() -> str:
    """torch.compile backend of vLLM's small compiled helpers (the sampler's
    top-k/top-p, the MoE router, the TP vocabulary mask): Gaudi's own graph
    compiler, else the model's backend in emulation (eager unless
    VLLM_HPU_COMPILE_BACKEND names one)."""
    return model_compile_backend() or "eager"


def model_compile_backend() -> str | None:
    """The torch.compile backend for the model: VLLM_HPU_COMPILE_BACKEND, else
    Gaudi's graph compiler; None in emulation unless a backend is named."""
    chosen = get_envs().compile_backend
    if chosen:
        return chosen
    return "hpu_backend" if hpu_available() else None


def graph_compilations() -> int:
    """Graphs compiled so far in this process, from torch's own counters: dynamo's
    new graphs, plus the bridge's graph compilations (lazy and eager mode) on Gaudi."""
    from torch._dynamo.utils import counters

    count = int(counters["stats"]["unique_graphs"])
    if hpu_available():
        metrics = importlib.import_module("habana_frameworks.torch.hpu.metrics")
        stats = dict(metrics.metric_global("graph_compilation").stats())
        count += int(stats.get("TotalNumber", 0))
    return count


def cpu_fallbacks() -> dict[str, int] | None:
    """Operators that fell back to the host so far, by name, from the bridge's
    counters; None in emulation, where every operator runs on the host."""
    if not hpu_available():
        return None
    metrics = importlib.import_module("habana_frameworks.torch.hpu.metrics")
    stats = dict(metrics.metric_global("cpu_fallback").stats())
    return {str(op): int(n) for op, n in dict(stats.get("FallbackOps", {})).items()}


def emulated_ray_resources(num_devices: int) -> dict[str, float] | None:
    """Resources a Ray node started here must declare: Ray counts Gaudi cards
    itself, but finds none in emulation, so the emulated ones are named."""
    return None if hpu_available() else {"HPU": float(num_devices)}


def is_lazy() -> bool:
    return hpu_available() and get_envs().pt_hpu_lazy_mode == "1"


def _htcore() -> Any:
    return importlib.import_module("habana_frameworks.torch.core")


def mark_step() -> None:
    """Close the current lazy-mode graph (Gaudi lazy mode only)."""
    if is_lazy():
        _htcore().mark_step()


def synchronize() -> None:
    if hpu_available():
        torch.hpu.synchronize()  # type: ignore[attr-defined]


def device_stream(queued: bool) -> DeviceStream:
    """Where the runner's device work runs. Gaudi's bridge queues it itself, so
    it is submitted inline; in emulation it runs on one worker thread when
    ``queued`` (async scheduling), so the host overlaps it as on Gaudi, else on
    the calling thread. Either thread computes with ``compute_threads()``."""
    if hpu_available():
        return DeviceStream(threaded=False)
    num_threads = compute_threads(beside_host=queued)
    torch.set_num_threads(num_threads)  # the calling thread's own count
    return DeviceStream(threaded=queued, num_threads=num_threads)


def compute_threads(beside_host: bool = True) -> int:
    """Torch threads of device work in emulation, where the CPU is the device:
    OMP_NUM_THREADS as the user set it, else every core of this worker's share
    (vLLM's OMP_NUM_THREADS for its workers, or all usable cores) but one, the
    host thread's, where it runs ``beside_host`` (async scheduling: vLLM's
    scheduler and the runner's preparation beside the device work) or where
    OpenMP's threads busy-wait: more threads than free cores then wait for
    each other (a decode step ran 3 to 10 times slower on a busy 2-core
    machine with two threads, docs/benchmarks.md, async overlap). Synchronous
    steps (speculative decoding, async off) under OMP_WAIT_POLICY=PASSIVE take
    the whole share: the host thread waits for the device work there."""
    from vllm.utils.torch_utils import available_cpu_count

    envs = get_envs()
    given = envs.omp_num_threads.split(",")[0].strip()
    count = int(given) if given.isdigit() and int(given) > 0 else 0
    if count and not envs.omp_num_threads_set_by_vllm:
        return count
    share = count or available_cpu_count()
    sleeping_waits = envs.omp_wait_policy.strip().upper() == "PASSIVE"
    return share if sleeping_waits and not beside_host else max(1, share - 1)


def set_device(device: torch.device) -> None:
    if hpu_available():
        torch.hpu.set_device(device)  # type: ignore[attr-defined]


def manual_seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    if hpu_available():
        torch.hpu.manual_seed_all(seed)  # type: ignore[attr-defined]


def device_name() -> str:
    return torch.hpu.get_device_name() if hpu_available() else "HPU (CPU emulation)"  # type: ignore[attr-defined]


def init_device_memory() -> None:
    """At worker start, in emulation: pool host memory, then count emulated device
    memory from this point, less what the heap kept of earlier work (an earlier
    engine in this process), which the pool would hand out again uncounted."""
    if hpu_available():
        return
    device_memory.pool_host_memory()
    release_freed_memory()
    device_memory.meter().restart()


def mem_get_info() -> tuple[int, int]:
    """(free, total) device memory in bytes."""
    if hpu_available():
        free, total = torch.hpu.mem_get_info()  # type: ignore[attr-defined]
        return int(free), int(total)
    memory = device_memory.meter()
    return memory.free(), memory.total()


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of device ``tensor`` in host memory (sleep mode's offload). In
    emulation the copy stays in this process, counted apart from the device."""
    if hpu_available():
        return tensor.to("cpu")
    copy = tensor.detach().clone()
    device_memory.meter().hold_on_host(copy)
    return copy


def release_freed_memory() -> None:
    """Hand what freed tensors held back to the device: on Gaudi the bridge's
    allocator takes freed blocks back itself once queued work completes; in
    emulation glibc returns the heap's free pages to the system, which the
    pooling set by ``device_memory.pool_host_memory`` otherwise keeps."""
    synchronize()
    if not hpu_available():
        device_memory.trim_host_heap()


def memory_used() -> int:
    free, total = mem_get_info()
    return total - free


def total_memory() -> int:
    return mem_get_info()[1]


GraphCall = Callable[..., Any]  # call(use_graph, **inputs) -> the forward's output


def wrap_in_graph(module: torch.nn.Module) -> GraphCall:
    """Wrap ``module``'s forward for HPU graphs, once (in place, on Gaudi):
    returns ``call(use_graph, **inputs)``, which with ``use_graph`` records a
    graph per structure of ``inputs`` and replays it after, reading afresh only
    the tensors among ``inputs``; else runs the forward (the bridge's
    ``bypass_hpu_graphs``). In emulation every call runs the forward."""
    graphs = _hpu_graphs()
    if graphs is None:
        return lambda use_graph, **inputs: module(**inputs)
    graphs.wrap_in_hpu_graph(module, disable_tensor_cache=True)
    return lambda use_graph, **inputs: module(**inputs, bypass_hpu_graphs=not use_graph)


def _hpu_graphs() -> Any | None:
    """The bridge's HPU graph module, or None without Gaudi."""
    if not hpu_available():
        return None
    return importlib.import_module("habana_frameworks.torch.hpu.graphs")


def reset_graphs(module: torch.nn.Module) -> None:
    """Forget the HPU graphs recorded for ``module`` (``wrap_in_graph``), after
    the tensors they read moved (sleep mode): each bucket records again on its
    next call. A no-op where nothing was recorded (the bridge adds
    ``clear_cache`` to the modules it wraps)."""
    clear_cache = getattr(module, "clear_cache", None)
    if callable(clear_cache):
        clear_cache()


def prepare_weights(model: torch.nn.Module) -> bool:
    """Before an eager run: Gaudi runs the loaded weights as they are; the CPU
    packs the linear layers' for oneDNN (see ``emulation/packed_linear.py``). Whether
    any layer was packed."""
    if hpu_available():
        return False
    from vllm_hpu.emulation.packed_linear import pack_linear_layers

    return pack_linear_layers(model) > 0


# Kernels are looked up once per process: compiled regions ask for them on every
# forward, and torch.compile reads a filled dict as a constant (an env lookup or an
# import inside a traced region would break the graph).
_KERNELS: dict[str, Any] = {}


def _import_kernel(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def _kernel(
    module: str,
    name: str,
    enabled: Callable[[], bool] = lambda: True,
    emulated: Any = None,
) -> Any | None:
    """Gaudi's kernel ``module.name``; in emulation its CPU counterpart, if any."""
    key = f"{module}.{name}"
    if key not in _KERNELS:
        if not enabled():
            _KERNELS[key] = None
        elif hpu_available():
            _KERNELS[key] = _import_kernel(module, name)
        else:
            _KERNELS[key] = emulated
    return _KERNELS[key]


def fused_rms_norm() -> Callable[..., Any] | None:
    """Gaudi's fused RMSNorm kernel, or None where it does not exist."""
    return _kernel("habana_frameworks.torch.hpex.normalization", "FusedRMSNorm")


def fused_rotary_embedding() -> Callable[..., Any] | None:
    return _kernel("habana_frameworks.torch.hpex.kernels", "RotaryPosEmbeddingHelperV1")


class _CpuFusedSDPA:
    """FusedSDPA's call on the CPU: torch's fused attention kernel, heads-first
    inputs, an additive mask, grouped-query K/V shared without being repeated."""

    @staticmethod
    def apply(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None,
        dropout_p: float,
        is_causal: bool,
        scale: float,
    ) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=query.shape[1] != key.shape[1],
        )


def fused_sdpa() -> Any | None:
    """Fused prompt attention (VLLM_PROMPT_USE_FUSEDSDPA): Gaudi's FusedSDPA, or
    torch's CPU kernel in emulation; None when the variable turns it off."""
    return _kernel(
        "habana_frameworks.torch.hpex.kernels",
        "FusedSDPA",
        lambda: get_envs().prompt_use_fusedsdpa,
        emulated=_CpuFusedSDPA,
    )


def _cpu_sdpa_stats(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's CPU flash kernel, which also returns the log-sum-exp of the
    scores; heads-first, as many query heads as K/V heads."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, False, attn_mask=attn_mask, scale=scale
    )
    return out, lse


def _hpu_sdpa_stats(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaudi's FusedSDPA forward that keeps what its backward needs: the row
    maxima m and the inverse sums 1/l of the scores, so log-sum-exp = m - log(1/l).
    Arguments: dropout, scale, causal, keep statistics, softmax mode, valid
    lengths, padding side."""
    out, row_max, inverse_sum = torch.ops.hpu.sdpa_recomp_fwd(
        query, key, value, attn_mask, 0.0, scale, False, True, "None", None, "right"
    )[:3]
    lse = row_max.float() - torch.log(inverse_sum.float())
    return out, lse.reshape(out.shape[:-1])


def fused_sdpa_stats() -> Callable[..., tuple[torch.Tensor, torch.Tensor]] | None:
    """The fused prompt kernel returning (output, log-sum-exp [bs, heads, q]), for
    attention cut into tiles (``ops/sliced_attention.py``): Gaudi's FusedSDPA
    forward with statistics, or torch's CPU flash kernel in emulation; None when
    VLLM_PROMPT_USE_FUSEDSDPA turns the fused kernel off."""
    if not get_envs().prompt_use_fusedsdpa:
        return None
    return _hpu_sdpa_stats if hpu_available() else _cpu_sdpa_stats


def fused_moe() -> Callable[..., Any] | None:
    """Gaudi's fused mixture-of-experts kernel (``torch.ops.hpu.mixture_of_experts``),
    or None without Gaudi, where ``ops/moe.py`` runs the experts in plain torch."""
    key = "torch.ops.hpu.mixture_of_experts"
    if key not in _KERNELS:
        kernels = torch.ops.hpu if hpu_available() else None
        _KERNELS[key] = getattr(kernels, "mixture_of_experts", None)
    return _KERNELS[key]


def fused_moe_fp8() -> Callable[..., Any] | None:
    """Gaudi's fused MoE kernel on fp8 tokens and experts with their scales
    (``torch.ops.hpu.mixture_of_experts.fp8_fused_weights``), or None without
    Gaudi, where ``quantization/fp8_moe.py`` rounds the input through fp8 and runs the
    dequantized experts."""
    key = "torch.ops.hpu.mixture_of_experts.fp8_fused_weights"
    if key not in _KERNELS:
        moe = fused_moe()
        _KERNELS[key] = getattr(moe, "fp8_fused_weights", None)
    return _KERNELS[key]


def fp8_gemm() -> Callable[..., Any] | None:
    """Gaudi's fp8 matmul with per-tensor or per-row/column dequantization scales
    (``torch.ops.hpu.fp8_gemm_v2``), or None without Gaudi, where
    ``quantization/fp8.py`` multiplies the fp8 values upcast in plain torch."""
    key = "torch.ops.hpu.fp8_gemm_v2"
    if key not in _KERNELS:
        kernels = torch.ops.hpu if hpu_available() else None
        _KERNELS[key] = getattr(kernels, "fp8_gemm_v2", None)
    return _KERNELS[key]


def load_kernels() -> None:
    """Look every kernel up now, before a region is compiled: a lookup first made
    inside a compiled region would leave a guard that fails once it is made."""
    fused_rms_norm()
    fused_rotary_embedding()
    fused_sdpa()
    fused_moe()
    fused_moe_fp8()
    fp8_gemm()
    fused_rotary_mode(True)


def fused_rotary_mode(is_neox_style: bool) -> Any | None:
    """Gaudi's RotaryPosEmbeddingMode for a rotary layout, or None without Gaudi:
    BLOCKWISE rotates halves (GPT-NeoX), PAIRWISE rotates interleaved pairs (GPT-J)."""
    modes = _kernel("habana_frameworks.torch.hpex.kernels", "RotaryPosEmbeddingMode")
    if modes is None:
        return None
    return modes.BLOCKWISE if is_neox_style else modes.PAIRWISE  # type: ignore[attr-defined]
