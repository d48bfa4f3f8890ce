"""A user's compilation settings (``-O``, ``--compilation-config``) on the HPU
runner, which compiles and captures graphs per bucket itself. Read before
vLLM's defaults, so only what the user set is seen; each is honoured where the
runner has an equivalent, else refused naming the fix or logged. The platform
then turns vLLM's own compilation off."""

from typing import TYPE_CHECKING

from vllm import envs as vllm_envs
from vllm.logger import init_logger

from vllm_hpu import device

if TYPE_CHECKING:
    from vllm.config import CompilationConfig, VllmConfig

    from vllm_hpu.worker.compilation.execution import ExecutionMode

logger = init_logger("vllm.hpu.compilation")

# Why a runner captures no graphs, and how it would.
NO_GRAPHS = (
    "captures no graphs: it runs {} (graphs need Gaudi's HPU graph mode without "
    "--enforce-eager, or VLLM_HPU_COMPILE_BACKEND in emulation)"
)
# Set in additional_config once checked: a config vLLM re-initialises
# (dataclasses.replace for a draft model) holds our settings, not the user's.
CHECKED = "hpu_compilation_checked"


def apply_user_compilation(vllm_config: "VllmConfig") -> None:
    """Honour, refuse or log each compilation setting the user made."""
    extra = vllm_config.additional_config
    if not isinstance(extra, dict) or extra.get(CHECKED):
        return
    extra[CHECKED] = True
    _optimization_level(vllm_config)
    compilation = vllm_config.compilation_config
    runner = runner_mode(vllm_config)
    _compilation_mode(compilation, runner)
    _graph_settings(compilation, runner)
    _custom_ops(compilation)


def runner_mode(vllm_config: "VllmConfig") -> "ExecutionMode":
    from vllm_hpu.worker.compilation.execution import select_mode

    model_config = vllm_config.model_config
    eager = model_config is not None and model_config.enforce_eager
    return select_mode(device.is_lazy(), eager, device.model_compile_backend())


def _optimization_level(vllm_config: "VllmConfig") -> None:
    """-O0 (no compilation, no graphs) is --enforce-eager here; -O1 and -O3
    name vLLM's Inductor and CUDA graph levels, which have no HPU counterpart."""
    from vllm.config.vllm import OptimizationLevel

    level = vllm_config.optimization_level
    model_config = vllm_config.model_config
    if level == OptimizationLevel.O0 and model_config is not None:
        model_config.enforce_eager = True
        # What vLLM sets for --enforce-eager before this hook (and on the core's pass).
        vllm_config.kernel_config.enable_jit_warmup = False
        logger.info(
            "-O0 (no compilation, no graphs): the HPU runner runs the model "
            "eagerly, as with --enforce-eager."
        )
    elif level != OptimizationLevel.O2:
        logger.info(
            "-O%d sets vLLM's Inductor and CUDA graph levels, which do not exist on "
            "HPU: the runner runs %s, as at every level but -O0 (eager).",
            int(level),
            runner_mode(vllm_config).value,
        )


def _compilation_mode(
    compilation: "CompilationConfig", runner: "ExecutionMode"
) -> None:
    """No torch.compile (NONE) or torch.compile (1, 2): honoured when the runner
    does the same, refused with the fix otherwise; vLLM's own compile (3) logged."""
    from vllm.config import CompilationMode

    from vllm_hpu.worker.compilation.execution import ExecutionMode

    mode = compilation.mode
    if mode is None:
        return
    if mode == CompilationMode.NONE and vllm_envs.VLLM_USE_BREAKABLE_CUDAGRAPH:
        # vLLM's own default for DeepSeek-V3.2 and kin, before this check runs.
        logger.info(
            "VLLM_USE_BREAKABLE_CUDAGRAPH (vLLM's breakable CUDA graphs, which set "
            "compilation mode NONE) does not apply on HPU: the runner runs %s.",
            runner.value,
        )
        return
    compiles = runner is ExecutionMode.COMPILE
    backend = device.model_compile_backend()
    if mode == CompilationMode.NONE and compiles:
        raise ValueError(
            "--compilation-config mode NONE (no torch.compile) contradicts the HPU "
            f"runner's torch.compile with backend {backend!r} "
            "(VLLM_HPU_COMPILE_BACKEND, or Gaudi's PT_HPU_LAZY_MODE=0): unset that, "
            "or drop the mode."
        )
    if mode in (CompilationMode.STOCK_TORCH_COMPILE, CompilationMode.DYNAMO_TRACE_ONCE):
        if not compiles:
            raise ValueError(
                f"--compilation-config mode {mode.name} asks for torch.compile, which "
                f"the HPU runner does not use here (it runs {runner.value}): set "
                "VLLM_HPU_COMPILE_BACKEND to a backend (e.g. inductor) in emulation, "
                "PT_HPU_LAZY_MODE=0 on Gaudi, or drop the mode."
            )
        if compilation.backend and compilation.backend != backend:
            logger.info(
                "--compilation-config backend %r: the HPU runner compiles with %r "
                "(VLLM_HPU_COMPILE_BACKEND names it).",
                compilation.backend,
                backend,
            )
    if mode == CompilationMode.VLLM_COMPILE:
        logger.warning(
            "--compilation-config mode VLLM_COMPILE: vLLM's piecewise Inductor "
            "compile (its passes, CUDA graphs) does not exist on HPU; the runner "
            "runs %s instead.",
            runner.value,
        )
    else:
        logger.info(
            "--compilation-config mode %s: honoured (%s).", mode.name, runner.value
        )


def _graph_settings(compilation: "CompilationConfig", runner: "ExecutionMode") -> None:
    """Graphs are captured per bucket within VLLM_GRAPH_RESERVED_MEM: asking for
    none is honoured only where none are captured; sizes follow the buckets."""
    from vllm.config import CUDAGraphMode

    graph_mode = compilation.cudagraph_mode
    captures = runner.captures_graphs
    if graph_mode == CUDAGraphMode.NONE and captures:
        raise ValueError(
            f"--compilation-config cudagraph_mode NONE: the HPU runner captures "
            f"graphs ({runner.value}); pass --enforce-eager to capture none, or "
            "drop cudagraph_mode."
        )
    if graph_mode is not None:
        logger.info(
            "--compilation-config cudagraph_mode %s: the HPU runner %s.",
            graph_mode.name,
            NO_GRAPHS.format(runner.value)
            if not captures
            else "captures a graph per bucket within VLLM_GRAPH_RESERVED_MEM",
        )
    if compilation.cudagraph_capture_sizes or compilation.max_cudagraph_capture_size:
        logger.info(
            "--compilation-config cudagraph capture sizes do not apply: HPU graphs "
            "are captured per bucket (VLLM_*_BUCKET_*, VLLM_HPU_BUCKETING_STRATEGY)."
        )


def _custom_ops(compilation: "CompilationConfig") -> None:
    disabling = [
        op for op in compilation.custom_ops if op == "none" or op.startswith("-")
    ]
    if disabling:
        raise ValueError(
            f"--compilation-config custom_ops {disabling} would switch off the HPU "
            "plugin's implementations of vLLM's layers (RMSNorm, rotary embedding, "
            "fused MoE, ...), which its runner needs: drop them (custom_ops is "
            "['all'] on HPU)."
        )
