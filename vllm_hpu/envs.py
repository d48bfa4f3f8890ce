"""Every environment variable the plugin reads, in one typed table: the only
module reading ``os.environ``. Values are parsed once into a frozen
:class:`HpuEnvs`; a malformed one raises a ``ValueError`` naming the variable
and what it accepts, before any engine is built."""

import dataclasses
import functools
import os
from collections.abc import Mapping
from typing import Any

from vllm_hpu.env_values import (
    Parser,
    boolean,
    choice,
    fraction,
    non_negative_int,
    positive_float,
    positive_int,
    text,
)

# Prompt attention slicing: passes of this many keys are cut, by default into
# tiles of half of it, rounded up to this multiple (the reference's on Gaudi).
SLICE_THRESHOLD = 8192
SLICE_CHUNK_MULTIPLE = 1024
# Where VLLM_HPU_FAIL_AT can make an engine fail (fail_if_injected).
FAILURE_STAGES = ("config", "model_load", "kv_allocation", "warmup", "first_step")


def _var(name: str, parse: Parser, default: Any, doc: str, no_effect: str = "") -> Any:
    metadata = {"env": name, "parse": parse, "doc": doc, "no_effect": no_effect}
    return dataclasses.field(default=default, metadata=metadata)


def _no_effect(name: str, reason: str, parse: Parser = boolean) -> Any:
    """A reference Gaudi variable accepted (and checked) that does nothing here."""
    return _var(name, parse, None, f"no effect: {reason}", no_effect=reason)


def _bucket_var(phase: str, dim: str, part: str) -> Any:
    name = f"VLLM_{phase}_{dim}_BUCKET_{part}"
    doc = f"{phase.lower()} {dim.lower()} bucket {part.lower()}; unset: the default"
    return _var(name, non_negative_int if dim == "BLOCK" else positive_int, None, doc)


@dataclasses.dataclass(frozen=True)
class HpuEnvs:
    emulation: bool = _var(
        "VLLM_HPU_EMULATION",
        boolean,
        False,
        "run the HPU plugin on the CPU (emulation)",
    )
    # Memory the emulated device pretends to have; the KV cache is sized from it.
    emulation_memory_gb: float = _var(
        "VLLM_HPU_EMULATION_MEMORY_GB",
        positive_float,
        4.0,
        "device memory of the emulated HPU, in GiB",
    )
    quant_config: str = _var(
        "QUANT_CONFIG",
        text,
        "",
        "Intel Neural Compressor FP8 config file (MEASURE or QUANTIZE JSON)",
    )
    # Read, not set: the emulated device's torch threads (device.compute_threads).
    omp_num_threads: str = _var(
        "OMP_NUM_THREADS",
        text,
        "",
        "OpenMP's own; in emulation the torch threads of device work (unset: every "
        "usable core but the host thread's)",
    )
    # Read, not set: libgomp reads it when torch loads (device.compute_threads).
    omp_wait_policy: str = _var(
        "OMP_WAIT_POLICY",
        text,
        "",
        "OpenMP's own; PASSIVE (threads sleep while they wait) lets emulation's "
        "synchronous steps compute on every core",
    )
    # vllm.utils.torch_utils.OMP_NUM_THREADS_SET_BY_VLLM (vLLM not imported here).
    omp_num_threads_set_by_vllm: bool = _var(
        "VLLM_OMP_NUM_THREADS_SET_BY_VLLM",
        boolean,
        False,
        "vLLM's own: OMP_NUM_THREADS is its share of the cores per worker process",
    )
    # Read, not set: emulation pools host memory unless these tune glibc's malloc.
    glibc_tunables: str = _var(
        "GLIBC_TUNABLES",
        text,
        "",
        "glibc's own; with glibc.malloc.* settings emulation keeps malloc as set",
    )
    skip_warmup: bool = _var(
        "VLLM_SKIP_WARMUP", boolean, False, "skip warmup (development only)"
    )
    full_warmup: bool = _var(
        "VLLM_FULL_WARMUP",
        boolean,
        False,
        "fail instead of warning when a shape was not warmed up",
    )
    graph_reserved_mem: float = _var(
        "VLLM_GRAPH_RESERVED_MEM",
        fraction,
        0.1,
        "share of usable memory kept for graphs (0 with enforce_eager)",
    )
    graph_prompt_ratio: float = _var(
        "VLLM_GRAPH_PROMPT_RATIO",
        fraction,
        0.3,
        "share of the graph memory for prompt graphs; decode gets the rest",
    )
    graph_prompt_strategy: str = _var(
        "VLLM_GRAPH_PROMPT_STRATEGY",
        choice("min_tokens", "max_bs"),
        "min_tokens",
        "order in which prompt graphs are captured",
    )
    graph_decode_strategy: str = _var(
        "VLLM_GRAPH_DECODE_STRATEGY",
        choice("min_tokens", "max_bs"),
        "max_bs",
        "order in which decode graphs are captured",
    )
    exponential_bucketing: bool | None = _var(
        "VLLM_EXPONENTIAL_BUCKETING",
        boolean,
        None,
        "true: exponential buckets, false: linear ones; unset: "
        "VLLM_HPU_BUCKETING_STRATEGY",
    )
    # Measures what bucketing costs: on Gaudi every new shape compiles a graph.
    exact_shapes: bool = _var(
        "VLLM_HPU_EXACT_SHAPES",
        boolean,
        False,
        "no bucketing: every pass runs at its exact shape (benchmarks, debugging)",
    )
    # Bucket sets beyond the range variables (docs/bucketing.md, "Strategies").
    bucketing_strategy: str = _var(
        "VLLM_HPU_BUCKETING_STRATEGY",
        choice("compact", "linear", "exponential", "reference", "reference-merged"),
        "compact",
        "how buckets are generated: compact (default), linear, exponential, "
        "reference (the reference Gaudi plugin's default buckets, one prompt per "
        "pass) or reference-merged (its merged-prefill mode)",
    )
    bucketing_from_file: str = _var(
        "VLLM_BUCKETING_FROM_FILE",
        text,
        "",
        "a bucket file (reference format) to warm up instead of generated buckets",
    )
    # Prompt passes pack their chunks into one sequence (docs/bucketing.md).
    merged_prefill: bool | None = _var(
        "VLLM_HPU_MERGED_PREFILL",
        boolean,
        None,
        "pack a step's prompt chunks into one sequence with a block-diagonal mask "
        "(prompt buckets by total tokens); false: one padded row per prompt; unset: "
        "on, except with VLLM_PROMPT_BS_BUCKET_* set or strategy reference",
    )
    # Written by the runner after warmup; read by python -m vllm_hpu.bucketing.
    bucket_trace: str = _var(
        "VLLM_HPU_BUCKET_TRACE",
        text,
        "",
        "record every step's real shape to this file (JSON lines) for the planner",
    )
    prompt_bs_bucket_min: int | None = _bucket_var("PROMPT", "BS", "MIN")
    prompt_bs_bucket_step: int | None = _bucket_var("PROMPT", "BS", "STEP")
    prompt_bs_bucket_max: int | None = _bucket_var("PROMPT", "BS", "MAX")
    prompt_seq_bucket_min: int | None = _bucket_var("PROMPT", "SEQ", "MIN")
    prompt_seq_bucket_step: int | None = _bucket_var("PROMPT", "SEQ", "STEP")
    prompt_seq_bucket_max: int | None = _bucket_var("PROMPT", "SEQ", "MAX")
    prompt_block_bucket_min: int | None = _bucket_var("PROMPT", "BLOCK", "MIN")
    prompt_block_bucket_step: int | None = _bucket_var("PROMPT", "BLOCK", "STEP")
    prompt_block_bucket_max: int | None = _bucket_var("PROMPT", "BLOCK", "MAX")
    decode_bs_bucket_min: int | None = _bucket_var("DECODE", "BS", "MIN")
    decode_bs_bucket_step: int | None = _bucket_var("DECODE", "BS", "STEP")
    decode_bs_bucket_max: int | None = _bucket_var("DECODE", "BS", "MAX")
    decode_block_bucket_min: int | None = _bucket_var("DECODE", "BLOCK", "MIN")
    decode_block_bucket_step: int | None = _bucket_var("DECODE", "BLOCK", "STEP")
    decode_block_bucket_max: int | None = _bucket_var("DECODE", "BLOCK", "MAX")
    # Older Gaudi releases sized decode buckets in tokens; accepted, in tokens.
    decode_seq_bucket_min: int | None = _bucket_var("DECODE", "SEQ", "MIN")
    decode_seq_bucket_step: int | None = _bucket_var("DECODE", "SEQ", "STEP")
    decode_seq_bucket_max: int | None = _bucket_var("DECODE", "SEQ", "MAX")
    prompt_use_fusedsdpa: bool = _var(
        "VLLM_PROMPT_USE_FUSEDSDPA",
        boolean,
        True,
        "fused SDPA kernel for prompt attention, cached context included (Gaudi's "
        "FusedSDPA; torch's scaled_dot_product_attention in emulation)",
    )
    # Tiles merged by log-sum-exp: never a whole [q, K] (docs/long-context.md).
    fsdpa_slice_enabled: bool = _var(
        "VLLM_HPU_FSDPA_SLICE_ENABLED",
        boolean,
        True,
        "cut long prompt attention into tiles (every path: fused, plain, merged, "
        "MLA); false: one [q, K] attention per pass",
    )
    fsdpa_slice_seq_len_thld: int = _var(
        "VLLM_HPU_FSDPA_SLICE_SEQ_LEN_THLD",
        positive_int,
        SLICE_THRESHOLD,
        "a prompt pass attending at least this many keys (context + queries) is cut",
    )
    fsdpa_slice_chunk_size: int = _var(
        "VLLM_HPU_FSDPA_SLICE_CHUNK_SIZE",
        positive_int,
        SLICE_THRESHOLD // 2,
        "queries and keys per tile, at most the threshold; unset: half the "
        "threshold rounded up to a multiple of 1024",
    )
    # A layer copies one slice of the batch's KV at a time (docs/long-context.md).
    decode_block_slice: int = _var(
        "VLLM_HPU_DECODE_BLOCK_SLICE",
        positive_int,
        4096,
        "decode attention reads at most this many KV blocks of the batch at a time",
    )
    fsdpa_slice_with_graph_breaks: bool | None = _no_effect(
        "VLLM_HPU_FSDPA_SLICE_WITH_GRAPH_BREAKS",
        "the tiles of a pass run in the pass's own graph",
    )
    log_step_graph_compilation: bool = _var(
        "VLLM_HPU_LOG_STEP_GRAPH_COMPILATION",
        boolean,
        False,
        "log the number of compilations each step caused, when non-zero",
    )
    log_step_graph_compilation_all: bool = _var(
        "VLLM_HPU_LOG_STEP_GRAPH_COMPILATION_ALL",
        boolean,
        False,
        "log the number of compilations of every step",
    )
    profiler_enabled: bool = _var(
        "VLLM_PROFILER_ENABLED",
        boolean,
        False,
        "write a Chrome-trace JSON of engine steps (opens in Perfetto)",
    )
    # The bridge's own switch, checked here; the mode is asked of the bridge.
    pt_hpu_lazy_mode: str | None = _var(
        "PT_HPU_LAZY_MODE",
        choice("0", "1"),
        None,
        "Habana bridge: 0 eager/torch.compile backend, 1 lazy mode; unset: the "
        "bridge's default",
    )
    # Off in emulation by default: tracing every bucket takes minutes on a CPU.
    compile_backend: str = _var(
        "VLLM_HPU_COMPILE_BACKEND",
        choice("hpu_backend", "eager", "aot_eager", "inductor"),
        "",
        "torch.compile backend; unset: hpu_backend on Gaudi, no compile in emulation",
    )
    compile_fullgraph: bool = _var(
        "VLLM_T_COMPILE_FULLGRAPH",
        boolean,
        False,
        "torch.compile(fullgraph=True): a graph break is an error",
    )
    # Warm restarts: a volume kept across pod restarts (README_GAUDI.md).
    cache_dir: str = _var(
        "VLLM_HPU_CACHE_DIR",
        text,
        "",
        "folder that keeps compiled graphs across restarts (one file per model, "
        "dtype, parallel sizes, bucket set and plugin version); unset: none kept",
    )
    profile_dir: str = _var(
        "VLLM_HPU_PROFILE_DIR",
        text,
        "hpu_profile",
        "folder for VLLM_PROFILER_ENABLED traces (trace_rank<N>_<pid>.json)",
    )
    # The bridge's counters; emulation has no fallbacks to count and says so once.
    log_step_cpu_fallbacks: bool = _var(
        "VLLM_HPU_LOG_STEP_CPU_FALLBACKS",
        boolean,
        False,
        "log the operators that fell back to the host in a step, when any did",
    )
    log_step_cpu_fallbacks_all: bool = _var(
        "VLLM_HPU_LOG_STEP_CPU_FALLBACKS_ALL",
        boolean,
        False,
        "log the host fallbacks of every step",
    )
    config_hidden_layers: int | None = _var(
        "VLLM_CONFIG_HIDDEN_LAYERS",
        positive_int,
        None,
        "lazy mode: close the graph (mark_step) every N decoder layers; unset: one "
        "graph per forward pass",
    )
    # The reference's newer name for the spacing; VLLM_EXPONENTIAL_BUCKETING wins.
    reference_bucketing_strategy: str | None = _var(
        "VLLM_BUCKETING_STRATEGY",
        choice("exp", "lin"),
        None,
        "exp: exponential buckets, lin: linear (VLLM_EXPONENTIAL_BUCKETING in the "
        "reference's newer name)",
    )
    # The reference's name for async scheduling; --(no-)async-scheduling wins.
    delayed_sampling: bool | None = _var(
        "VLLM_DELAYED_SAMPLING",
        boolean,
        None,
        "true: async scheduling on (vLLM's default), false: off; unset: vLLM decides",
    )
    # Test hook (tests/e2e/test_failures.py): every caller must get the failure.
    fail_at: str | None = _var(
        "VLLM_HPU_FAIL_AT",
        choice(*FAILURE_STAGES),
        None,
        "test hook: the engine fails at this stage (config: the engine core's "
        "pass over the config; model_load, kv_allocation, warmup, first_step); "
        "unset in normal use",
    )
    failure_notes: str | None = _var(
        "VLLM_HPU_FAILURE_NOTES",
        text,
        None,
        "set by the plugin, not by users: the folder where an engine or worker "
        "process that fails writes why, for the caller's exception",
    )
    # Accepted from the reference Gaudi plugin; each logs once why it does nothing.
    handle_topk_duplicates: bool | None = _no_effect(
        "VLLM_HANDLE_TOPK_DUPLICATES",
        "always so here: vLLM's sampler keeps every token tied with the k-th logit",
    )
    prompt_use_flex_attention: bool | None = _no_effect(
        "VLLM_PROMPT_USE_FLEX_ATTENTION",
        "prompt attention runs fused SDPA (VLLM_PROMPT_USE_FUSEDSDPA) or plain "
        "matmuls; there is no flex attention path",
    )
    t_compile_dynamic_shapes: bool | None = _no_effect(
        "VLLM_T_COMPILE_DYNAMIC_SHAPES",
        "torch.compile always compiles static shapes, one graph per bucket",
    )
    disable_mark_scales_as_const: bool | None = _no_effect(
        "VLLM_DISABLE_MARK_SCALES_AS_CONST",
        "FP8 scales are never marked as graph constants here",
    )
    # The reference README raises these for slow FP8 compiles; vLLM 0.32 dropped them.
    engine_iteration_timeout_s: int | None = _no_effect(
        "VLLM_ENGINE_ITERATION_TIMEOUT_S",
        "vLLM 0.32 dropped it; VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS bounds a step",
        positive_int,
    )
    rpc_timeout: int | None = _no_effect(
        "VLLM_RPC_TIMEOUT",
        "vLLM 0.32 dropped it; VLLM_ENGINE_READY_TIMEOUT_S bounds the engine start",
        positive_int,
    )
    contiguous_pa: bool | None = _no_effect(
        "VLLM_CONTIGUOUS_PA",
        "flat paged attention gathers the blocks of a batch wherever they lie; "
        "there is no contiguous-cache variant",
    )


def read_envs(environ: Mapping[str, str]) -> HpuEnvs:
    """Parse the plugin's variables out of ``environ``; empty means unset."""
    values = {}
    for field in dataclasses.fields(HpuEnvs):
        raw = environ.get(field.metadata["env"], "")
        if raw != "":
            values[field.name] = field.metadata["parse"](field.metadata["env"], raw)
    _apply_bucketing_strategy(values)
    _apply_slice_chunk_size(values)
    return HpuEnvs(**values)


def _apply_slice_chunk_size(values: dict[str, Any]) -> None:
    """The tile size defaults to half the threshold, rounded up to 1024 (the
    reference's granularity on Gaudi); a tile may not exceed the threshold."""
    threshold = values.get("fsdpa_slice_seq_len_thld", SLICE_THRESHOLD)
    chunk = values.get("fsdpa_slice_chunk_size")
    if chunk is None:
        half = -(-threshold // 2)
        chunk = -(-half // SLICE_CHUNK_MULTIPLE) * SLICE_CHUNK_MULTIPLE
        values["fsdpa_slice_chunk_size"] = min(chunk, threshold)
    elif chunk > threshold:
        raise ValueError(
            f"VLLM_HPU_FSDPA_SLICE_CHUNK_SIZE={chunk} exceeds "
            f"VLLM_HPU_FSDPA_SLICE_SEQ_LEN_THLD={threshold}: a tile must not be "
            "longer than the passes that are cut; lower the chunk size or raise "
            "the threshold."
        )


def _apply_bucketing_strategy(values: dict[str, Any]) -> None:
    """The strategy's spacing; VLLM_EXPONENTIAL_BUCKETING, if also set, must agree."""
    strategy = values.get("reference_bucketing_strategy")
    if strategy is None:
        return
    exponential = strategy == "exp"
    explicit = values.setdefault("exponential_bucketing", exponential)
    if explicit != exponential:
        raise ValueError(
            f"VLLM_BUCKETING_STRATEGY={strategy} contradicts "
            f"VLLM_EXPONENTIAL_BUCKETING={int(explicit)}: set only one of them."
        )


def no_effect_notes(envs: HpuEnvs) -> list[str]:
    """One line per reference Gaudi variable that is set but does nothing here."""
    return [
        f"{field.metadata['env']} is accepted but has no effect: "
        f"{field.metadata['no_effect']}."
        for field in dataclasses.fields(HpuEnvs)
        if field.metadata["no_effect"] and getattr(envs, field.name) is not None
    ]


@functools.cache
def get_envs() -> HpuEnvs:
    """The process's variables, parsed once."""
    return read_envs(os.environ)


def variable_names() -> list[str]:
    """Every variable the plugin owns, for vLLM's unknown-variable check."""
    return [field.metadata["env"] for field in dataclasses.fields(HpuEnvs)]


def unknown_vllm_variables(environ: Mapping[str, str], known: set[str]) -> list[str]:
    """``VLLM_*`` names in ``environ`` that neither vLLM nor the plugin owns."""
    ours = set(variable_names())
    return sorted(
        name
        for name in environ
        if name.startswith("VLLM_") and name not in known and name not in ours
    )


# Variables others read from the environment, which the plugin writes when the
# user did not: vLLM's VLLM_WORKER_MULTIPROC_METHOD (as vLLM's CPU and XPU
# platforms do), Gaudi's PT_HPU_RECIPE_CACHE_CONFIG (read when the bridge
# loads), torch's GLOO_SOCKET_IFNAME (read when a process group is created).
def set_default(name: str, value: str) -> str:
    """``name`` set to ``value`` unless the user chose one; the value in force."""
    return os.environ.setdefault(name, value)


def emulation_at_start() -> bool:
    """VLLM_HPU_EMULATION as an interpreter starts, before the table is read (a
    malformed value reads as off here; get_envs reports it at start-up)."""
    try:
        return boolean("VLLM_HPU_EMULATION", os.environ.get("VLLM_HPU_EMULATION", "0"))
    except ValueError:
        return False


def set_environ(name: str, value: str) -> None:
    """``name`` set to ``value`` for this process and those it starts (a
    variable the plugin owns, such as VLLM_HPU_FAILURE_NOTES)."""
    os.environ[name] = value


def process_environ() -> Mapping[str, str]:
    """The live environment, for callers that must not read os.environ themselves."""
    return os.environ


def fail_if_injected(stage: str) -> None:
    """Raise at ``stage`` when VLLM_HPU_FAIL_AT names it (a test hook)."""
    if get_envs().fail_at == stage:
        raise RuntimeError(
            f"VLLM_HPU_FAIL_AT={stage}: a failure injected at {stage} (a test "
            "hook; unset the variable to run normally)."
        )
