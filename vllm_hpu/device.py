"""The single seam between the plugin and Gaudi hardware: only this module imports
``habana_frameworks`` or touches ``torch.hpu``. Every function has a CPU
counterpart, so the plugin runs the same code on Gaudi and a ``cpu`` device."""

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
        _set_up_lazy_mode_defaults()
        importlib.import_module("habana_frameworks.torch")
        found = bool(torch.hpu.is_available()) and torch.hpu.device_count() > 0  # type: ignore[attr-defined]
    except Exception:  # a broken bridge install means: no Gaudi here
        return False
    if found and _bridge_is_lazy():
        # Lazy mode has no torch.compile (Habana's PyTorch Support Matrix):
        # vLLM's compiled helpers (sampler, router, TP vocabulary mask) run
        # eagerly, as in the reference plugin (vllm-gaudi platform.py:429-431).
        torch._dynamo.config.disable = True
    elif found:
        # INC's fp8 scales are patched at run time, not constants (vllm-gaudi 453).
        envs.set_default("RUNTIME_SCALE_PATCHING", "1")
    return found


def _set_up_lazy_mode_defaults() -> None:
    """Lazy-mode settings before the bridge loads (vllm-gaudi platform.py:427-436):
    lazy collectives (multi-card HPU graphs) and no ``nn.Parameter`` weight-sharing
    patch (bridge v1.19.0 core/__init__.py:128-141)."""
    envs.set_default("PT_HPU_ENABLE_LAZY_COLLECTIVES", "true")
    envs.set_default("PT_HPU_WEIGHT_SHARING", "0")


def _bridge_is_lazy() -> bool:
    """The bridge's answer (lazy by default in v1.19.0 utils/internal.py:27)."""
    internal = importlib.import_module("habana_frameworks.torch.utils.internal")
    return bool(internal.is_lazy())


# Gaudi's recipe cache: folder, whether to empty it at start, size limit in MB.
RECIPE_CACHE_MB = 8192


def _set_up_recipe_cache() -> None:
    """With VLLM_HPU_CACHE_DIR, the bridge's recipes go there, per plugin version."""
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
    """AVX-512 BF16 or AMX; else bf16 matmuls are much slower than float32."""
    return bool(
        torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    )


def fast_dtype() -> torch.dtype:
    """bf16 on Gaudi and bf16-capable CPUs, else float32."""
    if hpu_available() or cpu_has_bf16_instructions():
        return torch.bfloat16
    return torch.float32


def dist_backend() -> str:
    return "hccl" if hpu_available() else "gloo"


def local_device(named: torch.device) -> torch.device:
    """Where vLLM's "hpu:<rank>" really is: itself on Gaudi, else the CPU."""
    return named if hpu_available() else torch.device("cpu")


def compile_backend() -> str:
    """Backend of vLLM's small compiled helpers (sampler, router): model's or eager."""
    return model_compile_backend() or "eager"


def model_compile_backend() -> str | None:
    """VLLM_HPU_COMPILE_BACKEND, else Gaudi's graph compiler, else None."""
    chosen = get_envs().compile_backend
    if chosen:
        return chosen
    return "hpu_backend" if hpu_available() else None


def graph_compilations() -> int:
    """Graphs compiled in this process: dynamo's, plus the bridge's on Gaudi."""
    from torch._dynamo.utils import counters

    count = int(counters["stats"]["unique_graphs"])
    if hpu_available():
        metrics = importlib.import_module("habana_frameworks.torch.hpu.metrics")
        stats = dict(metrics.metric_global("graph_compilation").stats())
        count += int(stats.get("TotalNumber", 0))
    return count


def cpu_fallbacks() -> dict[str, int] | None:
    """Bridge counts of operators that fell back to the host; None in emulation."""
    if not hpu_available():
        return None
    metrics = importlib.import_module("habana_frameworks.torch.hpu.metrics")
    stats = dict(metrics.metric_global("cpu_fallback").stats())
    return {str(op): int(n) for op, n in dict(stats.get("FallbackOps", {})).items()}


def emulated_ray_resources(num_devices: int) -> dict[str, float] | None:
    """Ray counts Gaudi cards itself; emulated ones must be declared."""
    return None if hpu_available() else {"HPU": float(num_devices)}


def is_lazy() -> bool:
    """Gaudi's lazy mode (PT_HPU_LAZY_MODE, else the bridge's default)."""
    return hpu_available() and _bridge_is_lazy()


def _htcore() -> Any:
    return importlib.import_module("habana_frameworks.torch.core")


def mark_step() -> None:
    """Close the current lazy-mode graph (Gaudi lazy mode only)."""
    if is_lazy():
        _htcore().mark_step()


def mark_scales_const(model: torch.nn.Module) -> None:
    """After INC prepared or converted ``model`` on Gaudi: its scales become graph
    constants (the bridge's hpu_initialize, as the reference calls it)."""
    if hpu_available():
        _htcore().hpu_initialize(model, mark_only_scales_as_const=True)


def synchronize() -> None:
    if hpu_available():
        torch.hpu.synchronize()  # type: ignore[attr-defined]


def device_stream(queued: bool) -> DeviceStream:
    """Where device work runs: inline on Gaudi (the bridge queues it); in emulation on
    a worker thread when ``queued`` (async scheduling), else the calling thread."""
    if hpu_available():
        return DeviceStream(threaded=False)
    num_threads = compute_threads(beside_host=queued)
    torch.set_num_threads(num_threads)  # the calling thread's own count
    return DeviceStream(threaded=queued, num_threads=num_threads)


def compute_threads(beside_host: bool = True) -> int:
    """Torch threads of emulated device work: the user's OMP_NUM_THREADS, else
    this worker's share of cores less one for the host thread where it runs
    ``beside_host`` (async scheduling) or OpenMP busy-waits (oversubscribed,
    a decode step ran 3-10x slower on 2 cores, docs/benchmarks.md). Synchronous
    steps under OMP_WAIT_POLICY=PASSIVE take the whole share."""
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


# Synapse's card types (bridge v1.19.0 utils/experimental: synDeviceGaudi2 = 4,
# synDeviceGaudi3 = 5): the name torch.hpu.get_device_name() gives and the
# card's memory (96 GB Gaudi 2, 128 GB Gaudi 3: transformers' "Intel Gaudi" docs).
GAUDI2, GAUDI3 = 4, 5
_CARDS = {GAUDI2: ("GAUDI2", 96 * GiB), GAUDI3: ("GAUDI3", 128 * GiB)}


@functools.cache
def card_type() -> int | None:
    """Synapse's card type, without acquiring a card; None without Gaudi."""
    if not hpu_available():
        return None
    experimental = importlib.import_module("habana_frameworks.torch.utils.experimental")
    return int(experimental._get_device_type())


def fp8_max() -> float:
    """Largest e4m3 value: 240 on Gaudi2, whose e4m3 reserves the top exponent
    (vllm-gaudi extension/ops.py:25-30), else e4m3fn's 448."""
    if card_type() == GAUDI2:
        return 240.0
    return float(torch.finfo(torch.float8_e4m3fn).max)


def card_count() -> int:
    """Cards this process may use (HABANA_VISIBLE_MODULES); asks none."""
    return torch.hpu.device_count() if hpu_available() else 0  # type: ignore[attr-defined]


def device_name() -> str:
    """Without acquiring the card, which a front end would hold for life."""
    if not hpu_available():
        return "HPU (CPU emulation)"
    return _CARDS.get(card_type() or 0, (f"HPU (synapse type {card_type()})", 0))[0]


def init_device_memory() -> None:
    """In emulation: pool host memory and count device memory from here, after
    releasing what earlier engines left in the heap (else handed out uncounted)."""
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
    """Sleep mode's offload; in emulation counted apart from the device."""
    if hpu_available():
        return tensor.to("cpu")
    copy = tensor.detach().clone()
    device_memory.meter().hold_on_host(copy)
    return copy


def release_freed_memory() -> None:
    """Return freed memory: the bridge does so after queued work; in emulation
    glibc trims the heap that ``pool_host_memory`` otherwise keeps."""
    synchronize()
    if not hpu_available():
        device_memory.trim_host_heap()


def memory_used() -> int:
    free, total = mem_get_info()
    return total - free


def total_memory() -> int:
    """As published per generation (0 otherwise), without acquiring a card."""
    if hpu_available():
        return _CARDS.get(card_type() or 0, ("", 0))[1]
    return mem_get_info()[1]


GraphCall = Callable[..., Any]  # call(use_graph, **inputs) -> the forward's output


def wrap_in_graph(module: torch.nn.Module) -> GraphCall:
    """Wrap ``module`` for HPU graphs once, in place: ``call(use_graph, ...)``
    records a graph per structure of ``inputs`` and replays it, reading afresh
    only ``inputs``' tensors; else (or in emulation) runs the forward."""
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
    """Forget ``module``'s HPU graphs after their tensors moved (sleep mode)."""
    clear_cache = getattr(module, "clear_cache", None)
    if callable(clear_cache):
        clear_cache()


def prepare_weights(model: torch.nn.Module) -> bool:
    """In emulation, pack linear weights for oneDNN; whether any was packed."""
    if hpu_available():
        return False
    from vllm_hpu.emulation.packed_linear import pack_linear_layers

    return pack_linear_layers(model) > 0


# Looked up once: torch.compile reads a filled dict as a constant (no graph break).
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
    """``apply_rotary_pos_emb(x, cos, sin, position_ids, offset, mode)``, not
    ``RotaryPosEmbeddingHelperV1``, which rotates halves only (bridge v1.19.0
    RotaryPosEmbeddingHelper.py:50-139)."""
    return _kernel("habana_frameworks.torch.hpex.kernels", "apply_rotary_pos_emb")


class CpuFusedSDPA:
    """FusedSDPA on the CPU: heads-first, additive mask, GQA without repeats."""

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
    """FusedSDPA (or the CPU kernel); None if VLLM_PROMPT_USE_FUSEDSDPA=0."""
    return _kernel(
        "habana_frameworks.torch.hpex.kernels",
        "FusedSDPA",
        lambda: get_envs().prompt_use_fusedsdpa,
        emulated=CpuFusedSDPA,
    )


def cpu_sdpa_stats(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU flash kernel with log-sum-exp; heads-first, no GQA."""
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
    """FusedSDPA forward keeping row maxima m and inverse sums 1/l: lse = m - log(1/l).
    Args: dropout, scale, causal, keep stats, softmax mode, valid lengths, padding."""
    out, row_max, inverse_sum = torch.ops.hpu.sdpa_recomp_fwd(
        query, key, value, attn_mask, 0.0, scale, False, True, "None", None, "right"
    )[:3]
    lse = row_max.float() - torch.log(inverse_sum.float())
    return out, lse.reshape(out.shape[:-1])


def fused_sdpa_stats() -> Callable[..., tuple[torch.Tensor, torch.Tensor]] | None:
    """Fused prompt kernel returning (output, lse [bs, heads, q]) for tiled
    attention (``ops/sliced_attention.py``); None if the fused kernel is off."""
    if not get_envs().prompt_use_fusedsdpa:
        return None
    return _hpu_sdpa_stats if hpu_available() else cpu_sdpa_stats


def _hpu_op(name: str) -> Callable[..., Any] | None:
    """``torch.ops.hpu.<name>``, looked up once; None without Gaudi."""
    key = f"torch.ops.hpu.{name}"
    if key not in _KERNELS:
        kernels = torch.ops.hpu if hpu_available() else None
        _KERNELS[key] = getattr(kernels, name, None)
    return _KERNELS[key]


def fused_moe() -> Callable[..., Any] | None:
    """``torch.ops.hpu.mixture_of_experts`` (see ops/moe.py)."""
    return _hpu_op("mixture_of_experts")


def fused_moe_fp8(dynamic: bool) -> Callable[..., Any] | None:
    """Fused fp8 MoE, rounding the intermediate through fp8 with given scales (needs
    ``d_scale_intermediate_hidden_states``) or per token (``dynamic``)."""
    name = "fp8_fused_weights_dynamic" if dynamic else "fp8_fused_weights"
    key = f"torch.ops.hpu.mixture_of_experts.{name}"
    if key not in _KERNELS:
        _KERNELS[key] = getattr(fused_moe(), name, None)
    return _KERNELS[key]


def fp8_gemm() -> Callable[..., Any] | None:
    """``torch.ops.hpu.fp8_gemm_v2`` (per-tensor or per-row/column scales)."""
    return _hpu_op("fp8_gemm_v2")


def load_kernels() -> None:
    """Before compiling: a first lookup inside a region leaves a failing guard."""
    fused_rms_norm()
    fused_rotary_embedding()
    fused_sdpa()
    fused_moe()
    fused_moe_fp8(dynamic=False)
    fused_moe_fp8(dynamic=True)
    fp8_gemm()
    fused_rotary_mode(True)


def fused_rotary_mode(is_neox_style: bool) -> Any | None:
    """BLOCKWISE rotates halves (GPT-NeoX), PAIRWISE pairs (GPT-J)."""
    modes = _kernel("habana_frameworks.torch.hpex.kernels", "RotaryPosEmbeddingMode")
    if modes is None:
        return None
    return modes.BLOCKWISE if is_neox_style else modes.PAIRWISE  # type: ignore[attr-defined]
