"""The one place where the plugin changes code it does not own.

Each patch says why it exists, how it works, and which upstream change removes it.
"""

import argparse
import asyncio
import atexit
import contextlib
import dataclasses
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import pathlib
import re
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

# -- 1. torch.accelerator calls in CPU emulation ------------------------------------
# Why: vLLM's model loader and shutdown call ``torch.accelerator.empty_cache``,
# ``synchronize`` and ``empty_host_cache`` unconditionally; on a CPU-only torch they
# raise "Cannot access accelerator device when none is available". vLLM skips them
# only for its own CPU platform (``vllm/v1/worker/cpu_model_runner.py``).
# How: in CPU emulation, and only when torch reports no accelerator, those three
# functions become no-ops, which is what they mean on a machine without one.
# Upstream change that removes it: vLLM guarding those calls with
# ``torch.accelerator.is_available()``.


def _noop(*args: object, **kwargs: object) -> None:
    return None


@functools.cache
def apply_emulation_patches() -> None:
    """Idempotent; call only in CPU emulation."""
    if torch.accelerator.is_available():
        return
    for name in ("empty_cache", "synchronize", "empty_host_cache"):
        if hasattr(torch.accelerator, name):
            setattr(torch.accelerator, name, _noop)


# -- 2. --device / device= ----------------------------------------------------------
# Why: Gaudi users run ``vllm serve <model> --device hpu`` and ``LLM(model,
# device="hpu")``, as the reference Gaudi README says; vLLM 0.32 dropped ``device``
# from ``EngineArgs``, so the first is an "ambiguous option" and the second a
# TypeError. ``LLM(**kwargs)`` reaches ``EngineArgs(**kwargs)`` before vLLM loads any
# general plugin, so only the platform entry point (run whenever vLLM picks its
# platform, at import) comes early enough, and it runs whether or not we are active.
# How: once ``vllm.engine.arg_utils`` has been imported, ``EngineArgs`` and
# ``AsyncEngineArgs`` take a ``device`` keyword and ``EngineArgs.add_cli_args`` adds
# ``--device``; both check the value (``check_device``) and drop it: the platform is
# already chosen by then. ``from_cli_args`` copies only dataclass fields.
# Upstream change that removes it: ``device`` back in ``EngineArgs`` (vLLM < 0.11
# had it, checked against the platform).
ARG_UTILS = "vllm.engine.arg_utils"
PATCHED = "_vllm_hpu_accepts_device"
DEVICE_HELP = (
    "Kept for Gaudi users' commands: 'hpu' checks that the HPU plugin runs (on a "
    "Gaudi, or on the CPU with VLLM_HPU_EMULATION=1); vLLM picks the platform itself."
)


def check_device(value: str | None) -> None:
    """Accept the device a user named if it is the platform vLLM runs on."""
    from vllm_hpu import device

    if value in (None, "auto"):
        return
    # The condition register() returns the platform on (that module imports this).
    active = device.hpu_available() or device.is_emulation()
    if value == "hpu" and not active:
        raise ValueError(
            "--device hpu: no Gaudi found (the Habana bridge reports no HPU device). "
            "To run the HPU plugin on the CPU, set VLLM_HPU_EMULATION=1."
        )
    if value != "hpu" and active:
        raise ValueError(
            f"--device {value}: vLLM runs on the HPU plugin here (a Gaudi, or "
            "VLLM_HPU_EMULATION=1); pass --device hpu or leave the option out."
        )
    if value != "hpu":
        raise ValueError(
            f"--device {value}: vLLM 0.32 has no --device option and picks its "
            "platform itself; the HPU plugin only reads --device hpu. Leave it out."
        )


def _device_argument(value: str) -> str:
    try:
        check_device(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


def _with_device_keyword(init: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(init)
    def __init__(self: Any, *args: Any, device: str | None = None, **kwargs: Any):
        check_device(device)
        init(self, *args, **kwargs)

    return __init__


def _with_device_option(add_cli_args: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(add_cli_args)
    def wrapped(parser: Any) -> Any:
        parser.add_argument("--device", type=_device_argument, help=DEVICE_HELP)
        try:
            return add_cli_args(parser)
        except RuntimeError:
            # With no platform at all vLLM cannot build its parser ("Failed to
            # infer device type"); a --device on the command line is answered
            # first, so --device hpu says that no Gaudi was found.
            parser.parse_known_args()
            raise

    return wrapped


def _patch_engine_args(arg_utils: ModuleType) -> None:
    if getattr(arg_utils, PATCHED, False):
        return
    setattr(arg_utils, PATCHED, True)
    for cls in (arg_utils.EngineArgs, arg_utils.AsyncEngineArgs):
        cls.__init__ = _with_device_keyword(cls.__init__)
    engine_args = arg_utils.EngineArgs
    engine_args.add_cli_args = staticmethod(  # type: ignore[method-assign]
        _with_device_option(engine_args.add_cli_args)
    )
    engine_args.create_engine_config = _with_kv_transfer_check(  # type: ignore[method-assign]
        _with_requested_options(engine_args.create_engine_config)
    )


# Why: vLLM resolves some options before the platform sees them, keeping no trace of
# whether the user set them: VLLM_DELAYED_SAMPLING must apply only when
# --(no-)async-scheduling was not given, emulation picks the model's dtype only
# when --dtype was left at "auto" (ModelConfig replaces "auto" by a dtype), a
# hybrid model's --mamba-block-size is refused only where the user set it (vLLM
# fills it in from the block size or max_model_len), and an explicit
# --no-disable-hybrid-kv-cache-manager is refused where the runner cannot run KV
# cache groups (vLLM writes its own default, False, into the same field after the
# platform's hook). And the platform's hook runs more than once on one config: the
# engine core runs ``VllmConfig.__post_init__`` again on the config it was sent
# (``EngineCoreProc._perform_handshakes``), after the caller's pass changed those
# fields; a decision re-derived from them there differs from the caller's.
# How: EngineArgs still holds the user's values when create_engine_config starts:
# they are recorded in the config's ``additional_config`` (which travels with it to
# every process, and to the copies vLLM makes with ``dataclasses.replace``) before
# vLLM builds it. Every pass of the platform's hook reads them there
# (:func:`requested_options`); a config built without EngineArgs records what its
# first pass sees. Decisions taken once (and logged once) are marked there too
# (:func:`first_pass`).
# Upstream change that removes it: a platform hook before those options resolve,
# and a config that keeps which fields the user set.
REQUESTED = "hpu_requested"
DECIDED = "hpu_decided"
DEFAULT_ASYNC_SOURCE = "vLLM's default"


@dataclasses.dataclass(frozen=True)
class RequestedOptions:
    """What the user asked of the options vLLM resolves before the platform's hook
    (the defaults: nothing asked)."""

    dtype_auto: bool = False  # --dtype left at "auto"
    async_scheduling_source: str = DEFAULT_ASYNC_SOURCE
    mamba_block_size: int | None = None
    disable_hybrid_kv_cache_manager: bool | None = None


def requested_options(vllm_config: Any) -> RequestedOptions:
    """The options as the user gave them, recorded on the config (patch above); a
    config built without EngineArgs records its scheduler's choice at the first
    pass, before vLLM fills in its default."""
    scheduler_choice = vllm_config.scheduler_config.disable_hybrid_kv_cache_manager
    extra = vllm_config.additional_config
    if not isinstance(extra, dict):  # a user's own SupportsHash object
        return RequestedOptions(disable_hybrid_kv_cache_manager=scheduler_choice)
    asked = extra.setdefault(
        REQUESTED, {"disable_hybrid_kv_cache_manager": scheduler_choice}
    )
    return RequestedOptions(**asked)


def first_pass(vllm_config: Any, step: str) -> bool:
    """True the first time the platform's hook takes ``step`` on this config (or
    on copies sharing its ``additional_config``), False on every later pass."""
    extra = vllm_config.additional_config
    if not isinstance(extra, dict):
        return True
    decided = extra.setdefault(DECIDED, [])
    if step in decided:
        return False
    decided.append(step)
    return True


def _apply_delayed_sampling(engine_args: Any) -> str:
    """VLLM_DELAYED_SAMPLING=0 fills in an unset --async-scheduling (True stays
    unset: vLLM's default is on, and it turns async off itself, saying why,
    where it cannot run); returns which setting decides."""
    from vllm_hpu.envs import get_envs

    delayed_sampling = get_envs().delayed_sampling
    if engine_args.async_scheduling is not None:
        return "--async-scheduling / --no-async-scheduling"
    if delayed_sampling is None:
        return DEFAULT_ASYNC_SOURCE
    if not delayed_sampling:
        engine_args.async_scheduling = False
    return f"VLLM_DELAYED_SAMPLING={delayed_sampling}"


def _recorded_options(engine_args: Any) -> dict[str, Any]:
    return {
        "dtype_auto": engine_args.dtype == "auto",
        "async_scheduling_source": _apply_delayed_sampling(engine_args),
        "mamba_block_size": engine_args.mamba_block_size,
        "disable_hybrid_kv_cache_manager": (
            engine_args.disable_hybrid_kv_cache_manager
        ),
    }


def _with_requested_options(create: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(create)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        extra = self.additional_config
        if isinstance(extra, dict):  # a copy: the user's dict stays theirs
            self.additional_config = {**extra, REQUESTED: _recorded_options(self)}
        return create(self, *args, **kwargs)

    return wrapped


# Why: vLLM fills the KV transfer config from --kv-offloading-size (and
# --kv-offloading-backend) in VllmConfig.__post_init__, after it has called the
# platform's check_and_update_config: the platform never sees that connector, and
# the engine would load the model before failing in it.
# How: once EngineArgs.create_engine_config has built the config, still in the
# caller's process, the plugin checks it (kv_transfer/config.py): refuses the
# connectors it does not run, routes offloading to its own connector and spec,
# and turns async scheduling and the hybrid KV cache manager off for them (the
# engine core's pass over the config would otherwise decide so, or refuse, after
# the caller has started it). An offloading backend other than the
# native one is refused before, since building the config imports its connector.
# Upstream change that removes it: a platform hook after the transfer config is
# derived (VllmConfig._post_init_kv_transfer_config).


def _with_kv_transfer_check(create: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(create)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        from vllm_hpu import device

        # The condition register() returns the platform on (that module imports this).
        if not (device.hpu_available() or device.is_emulation()):
            return create(self, *args, **kwargs)
        from vllm_hpu.kv_transfer import config as kv_transfer

        kv_transfer.check_offloading_backend(
            self.kv_offloading_size, self.kv_offloading_backend
        )
        config = create(self, *args, **kwargs)
        kv_transfer.resolve_finished_config(config)
        from vllm_hpu.attention.windows import choose_kv_cache_manager

        asked = requested_options(config).disable_hybrid_kv_cache_manager
        choose_kv_cache_manager(config, asked)
        return config

    return wrapped


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Applies ``patch`` to module ``name`` right after it has been executed."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.patch = patch

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            self.patch(module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def accept_device_option() -> None:
    """Idempotent; safe to call while vLLM is being imported. Called from the
    platform entry point, and again from the general plugin, which vLLM's CLI
    loads before building its parser (at import, ``arg_utils`` may be half-run)."""
    arg_utils = sys.modules.get(ARG_UTILS)
    if arg_utils is None:
        if not any(isinstance(f, _PatchAfterImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _PatchAfterImport(ARG_UTILS, _patch_engine_args))
    elif hasattr(arg_utils, "AsyncEngineArgs"):
        _patch_engine_args(arg_utils)


# -- 3. torchvision's PyPI wheel beside the CPU build of torch ------------------------
# Why: vLLM's LLaVA-style models import transformers' image processors, which import
# torchvision; once torchvision is installed, transformers imports it even for text
# models. The only torchvision 0.28 on PyPI is built for CUDA torch: beside
# ``torch 2.13.0+cpu`` its extension ``_C`` does not load, and
# ``torchvision/_meta_registrations.py`` then fails on "operator torchvision::nms
# does not exist" (it registers fake kernels for nms and qnms unconditionally).
# How: before torchvision is first imported, load its extension the way it does
# itself; only if that fails, define the two operator schemas, without kernels.
# Image transforms work; detection ops (nms, roi_align) stay unavailable, and image
# processors do not use them. On Gaudi, torchvision comes with the software stack,
# its extension loads and nothing is defined.
# Upstream change that removes it: a CPU torchvision wheel on PyPI, or torchvision
# guarding those registrations like its other ops'.
_TORCHVISION_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor",
)
_torchvision_library: list[torch.library.Library] = []


def _torchvision_extension() -> pathlib.Path | None:
    # The path finder alone: the import hooks (torchvision_hook) call in here.
    spec = importlib.machinery.PathFinder.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return None
    package = pathlib.Path(next(iter(spec.submodule_search_locations)))
    return next(package.glob("_C*.so"), None)


@functools.cache
def allow_torchvision_import() -> None:
    """Idempotent; makes ``import torchvision`` work beside a torch it was not built
    for (see patch 3). Call before anything imports transformers' image code."""
    extension = _torchvision_extension()
    if extension is None or "torchvision" in sys.modules:
        return
    try:
        torch.ops.load_library(str(extension))
    except (OSError, RuntimeError):
        library = torch.library.Library("torchvision", "DEF")
        for schema in _TORCHVISION_SCHEMAS:
            library.define(schema)
        _torchvision_library.append(library)


# -- 4. a block-fp8 linear kernel for the platform -----------------------------------
# Why: vLLM picks the kernel of a block-scaled fp8 layer (``fp8`` checkpoints with
# ``weight_block_size``, compressed-tensors FP8_BLOCK) from
# ``_POSSIBLE_FP8_BLOCK_KERNELS``, which lists CUDA, ROCm, CPU and XPU kernels only;
# ``register_linear_kernel`` has no kind for it, so an out-of-tree platform finds
# none ("Failed to find a kernel ... Reasons:" with an empty list).
# How: our kernel becomes the table's entry for ``PlatformEnum.OOT``, once.
# Upstream change that removes it: a "fp8_block" kind in ``register_linear_kernel``.
def register_block_fp8_kernel(kernel: type) -> None:
    from vllm.model_executor.kernels import linear
    from vllm.platforms import PlatformEnum

    kernels = linear._POSSIBLE_FP8_BLOCK_KERNELS.setdefault(PlatformEnum.OOT, [])
    if kernel not in kernels:
        kernels.append(kernel)


# -- 5. fp8 per-tensor scales of fused layers -----------------------------------------
# Why: a fused layer (q, k and v; gate and up) of a per-tensor fp8 checkpoint loads
# one scale per shard; vLLM then requantizes every shard to the largest scale
# (``w8a8_utils.requantize_with_max_scale``) with its CUDA quantizer
# (``torch.ops._C.static_scaled_fp8_quant``), which is not there without vllm._C,
# and rounds every weight a second time.
# How: on this platform the shards keep their fp8 values and each output row takes
# its shard's scale (vLLM's ``convert_to_channelwise``): a per-channel scale, which
# the HPU fp8 kernel takes; one fused scale stays one scale, as in vLLM.
# Upstream change that removes it: a platform hook for fused per-tensor scales
# (the CPU int8 kernel already converts them to per-channel the same way).
def _shard_scales_per_row(
    weight: torch.Tensor, weight_scale: torch.Tensor, logical_widths: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    from vllm.model_executor.layers.quantization.utils.w8a8_utils import (
        convert_to_channelwise,
    )

    # vLLM's test: unloaded shard scales keep their placeholder, the dtype's min.
    unfused = (
        weight_scale.ndim != 0
        and weight_scale.numel() > 1
        and bool(weight_scale[-1] > torch.finfo(torch.float8_e4m3fn).min)
    )
    if not unfused:
        return weight_scale.max(), weight
    per_row: Any = convert_to_channelwise(weight_scale, logical_widths)
    return per_row, weight


@functools.cache
def keep_fp8_shard_scales() -> None:
    from vllm.model_executor.layers.quantization.utils import w8a8_utils

    w8a8_utils.requantize_with_max_scale = _shard_scales_per_row


# -- 6. NIXL from the nixl-cu12 wheel ----------------------------------------------
# Why: vLLM imports NIXL as ``nixl._api``. The ``nixl-cu12`` wheel (no CUDA needed;
# it bundles UCX) installs the package ``nixl_cu12``; the ``nixl`` meta package that
# maps one to the other requires both the cu12 and the cu13 wheels.
# How: an import finder answers ``nixl`` and ``nixl.*`` with the modules of
# ``nixl_cu12`` when no real ``nixl`` is installed, as the meta package does. It
# imports nothing until vLLM asks for NIXL.
# Upstream change that removes it: a ``nixl`` meta package whose CUDA variants are
# extras (or vLLM importing the variant packages itself, as it does for ROCm).
_NIXL = "nixl"
_NIXL_WHEEL = "nixl_cu12"


class _NixlFromWheel(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self) -> None:
        self.wheel_specs: dict[str, Any] = {}

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.partition(".")[0] != _NIXL:
            return None
        finder = importlib.machinery.PathFinder
        if finder.find_spec(_NIXL) is not None or finder.find_spec(_NIXL_WHEEL) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(_NIXL_WHEEL + spec.name[len(_NIXL) :])
        self.wheel_specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # Executed already, as nixl_cu12's; the import system has just set the
        # alias's spec on it: the module keeps its own.
        module.__spec__ = self.wheel_specs.pop(module.__name__)


@functools.cache
def import_nixl_from_wheel() -> None:
    """Idempotent; lets ``import nixl._api`` find the nixl-cu12 wheel."""
    sys.meta_path.insert(0, _NixlFromWheel())


# -- 7. Log lines that read as failures and are not ---------------------------------
# Why: every process of a normal start printed them. torchao (installed with Intel
# Neural Compressor, imported by transformers whenever present) tries to load its CUDA
# kernels (``_C_mxfp8``, ``_C_cutlass_90a``), which cannot load beside a torch built
# without CUDA and which no CPU or Gaudi path calls, and it registers two enums in a
# way torch now deprecates. vLLM warns that its Model Runner V2 needs Triton, though
# the HPU worker runs neither of vLLM's runners, and that "user settings" disabled
# Inductor: the platform turns vLLM's compilation off (our runner compiles per
# bucket), and the engine process checks the config again after its handshake,
# taking that for a user's choice. And vLLM's weight loader warns once per
# weight of a float32 checkpoint that runs in 16 bits ("Attempted to load
# weight ... with dtype torch.float32 into parameter with dtype
# torch.bfloat16"): emulation's default dtype on a CPU with bf16 instructions,
# said once at start-up by the platform ("Emulation runs the model in ...") and
# by vLLM ("Downcasting torch.float32 to torch.bfloat16").
# How: a filter on each logger that emits them drops exactly those records; all else
# those loggers say is kept. vLLM's "Failed to import from vllm._C" is avoided at the
# source instead (HpuPlatform.import_kernels).
# Upstream change that removes it: torchao loading CUDA kernels only with a CUDA
# torch and registering enums as opaque types; vLLM not warning about runners and
# compilation modes the platform chose, nor per weight about the model's dtype.
_TORCHAO_CUDA_KERNEL = re.compile(r"Failed to load \S*torchao[/\\]_C[^/\\:]*\.so: ")
_HARMLESS_VLLM_WARNINGS = (
    "Model Runner V2 requires Triton",
    "Inductor compilation was disabled by user settings",
)


def _is_torchao_cuda_kernel(record: logging.LogRecord) -> bool:
    cuda_torch = torch.version.cuda is not None
    return not cuda_torch and bool(_TORCHAO_CUDA_KERNEL.match(record.getMessage()))


def _is_torchao_enum_registration(record: logging.LogRecord) -> bool:
    args = record.args if isinstance(record.args, tuple) else ()
    module = getattr(args[0], "__module__", "") if args else ""
    return "is an Enum subclass" in str(record.msg) and module.startswith("torchao.")


def _is_harmless_vllm_warning(record: logging.LogRecord) -> bool:
    return str(record.msg).startswith(_HARMLESS_VLLM_WARNINGS)


def _is_announced_narrowing(record: logging.LogRecord) -> bool:
    """A float32 weight loaded into a 16-bit parameter: the model's dtype."""
    args = record.args if isinstance(record.args, tuple) else ()
    return (
        str(record.msg).startswith("Attempted to load weight %s with dtype")
        and len(args) == 3
        and args[1] == torch.float32
        and args[2] in (torch.bfloat16, torch.float16)
    )


_HARMLESS_RECORDS: dict[str, Callable[[logging.LogRecord], bool]] = {
    "torchao": _is_torchao_cuda_kernel,
    "torch.utils._pytree": _is_torchao_enum_registration,
    "vllm.config.vllm": _is_harmless_vllm_warning,
    "vllm.model_executor.models.utils": _is_announced_narrowing,
}


class _DropRecords(logging.Filter):
    def __init__(self, drop: Callable[[logging.LogRecord], bool]) -> None:
        super().__init__()
        self.drop = drop

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.drop(record)


@functools.cache
def drop_harmless_log_records() -> None:
    """Idempotent; call before torchao is imported (the platform entry point)."""
    for name, harmless in _HARMLESS_RECORDS.items():
        logging.getLogger(name).addFilter(_DropRecords(harmless))


# -- 8. An engine that dies: the caller's exception says why, and no call waits -----
# Why: when vLLM's engine core or one of its workers fails, the caller's client
# raises "Engine core initialization failed. See root cause above." or
# EngineDeadError ("See stack trace (above) for the root cause"): the cause is only
# in that process's log, which a notebook, or a program capturing its own output,
# never shows. And a utility call already sent to the core (LLMEngine's
# reset_mm_cache right after start-up, collective_rpc, sleep, ...) waits forever
# when the core dies: vLLM's engine monitor marks the client dead and shuts it
# down, but leaves the call's future unanswered (issue 50: a core that failed
# after its handshake left LLM(...) waiting in reset_mm_cache).
# How: the caller's first pass over a config names a folder for the engine's
# processes (VLLM_HPU_FAILURE_NOTES, inherited by every process vLLM starts;
# emptied for each engine, removed at exit). There, vLLM's records of a fatal
# failure (EngineCore and WorkerProc "failed to start", "fatal error", "hit an
# exception") also write their exception's last line into it; vLLM's start-up
# failure and its EngineDeadError carry those lines in their messages. And
# MPClient.shutdown, which the monitor calls once a core has died, fails the
# utility calls still waiting with EngineDeadError.
# Upstream change that removes it: vLLM failing pending utility calls when its
# monitor finds a core dead, and handing a dead engine's exception to its client.
_FATAL_RECORDS = {
    "vllm.v1.engine.core": (
        "EngineCore failed to start",
        "EngineCore encountered a fatal error",
    ),
    "vllm.v1.executor.multiproc_executor": (
        "WorkerProc failed to start",
        "WorkerProc failed",
        "WorkerProc hit an exception",
    ),
}
_caller_notes: list[pathlib.Path] = []  # the folder this process made, once made


def prepare_failure_notes() -> None:
    """In the caller's process, before an engine starts: an empty folder for
    what its processes say when they fail."""
    from vllm_hpu import envs

    if not _caller_notes:
        folder = pathlib.Path(tempfile.mkdtemp(prefix="vllm-hpu-failures-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _caller_notes.append(folder)
        envs.set_environ("VLLM_HPU_FAILURE_NOTES", str(folder))
    for note in _caller_notes[0].iterdir():
        note.unlink(missing_ok=True)


def failure_notes() -> str:
    """What this process's engine processes said when they failed, oldest first
    (empty: nothing, or no engine started from here)."""
    if not _caller_notes:
        return ""
    notes = sorted(_caller_notes[0].iterdir())  # named by the time written
    return " ".join(dict.fromkeys(n.read_text() for n in notes))


def _write_failure_note(error: BaseException) -> None:
    from vllm_hpu import envs

    with contextlib.suppress(OSError, ValueError):
        folder = envs.get_envs().failure_notes
        if folder:
            line = traceback.format_exception_only(error)[-1].strip()
            note = pathlib.Path(folder) / f"{time.time_ns()}-{os.getpid()}"
            note.write_text(line)


class _NoteFatalRecords(logging.Filter):
    def __init__(self, messages: tuple[str, ...]) -> None:
        super().__init__()
        self.messages = messages

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and str(record.msg).startswith(self.messages):
            _write_failure_note(error)
        return True


def _with_notes(message: str) -> str:
    said = failure_notes()
    return f"{message} The engine said: {said}" if said else message


def _patch_engine_dead_error(exceptions: ModuleType) -> None:
    init = exceptions.EngineDeadError.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.args = (_with_notes(self.args[0]), *self.args[1:])

    exceptions.EngineDeadError.__init__ = __init__


def _patch_startup_wait(utils: ModuleType) -> None:
    wait = utils.wait_for_engine_startup

    @functools.wraps(wait)
    def wait_for_engine_startup(*args: Any, **kwargs: Any) -> Any:
        try:
            return wait(*args, **kwargs)
        except RuntimeError as error:
            said = _with_notes(str(error))
            if said == str(error):
                raise
            raise RuntimeError(said) from error

    utils.wait_for_engine_startup = wait_for_engine_startup  # type: ignore[attr-defined]


def _fail_pending_calls(pending: dict[int, Any]) -> None:

    for call_id in list(pending):
        future = pending.pop(call_id, None)
        if future is None or future.done():
            continue
        if isinstance(future, asyncio.Future):
            with contextlib.suppress(RuntimeError):  # its loop has closed
                loop = future.get_loop()
                loop.call_soon_threadsafe(_fail_unless_done, future)
        else:
            _fail_unless_done(future)


def _fail_unless_done(future: Any) -> None:
    from vllm.v1.engine.exceptions import EngineDeadError

    if not future.done():
        future.set_exception(EngineDeadError())


def _patch_client_shutdown(core_client: ModuleType) -> None:
    shutdown = core_client.MPClient.shutdown

    @functools.wraps(shutdown)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            shutdown(self, *args, **kwargs)
        finally:
            _fail_pending_calls(getattr(self, "utility_results", {}))

    core_client.MPClient.shutdown = wrapped


_ENGINE_FAILURE_PATCHES = {
    "vllm.v1.engine.exceptions": _patch_engine_dead_error,
    "vllm.v1.engine.utils": _patch_startup_wait,
    "vllm.v1.engine.core_client": _patch_client_shutdown,
}


@functools.cache
def report_engine_failures() -> None:
    """Idempotent; the platform entry point calls it in every process."""
    for name, messages in _FATAL_RECORDS.items():
        logging.getLogger(name).addFilter(_NoteFatalRecords(messages))
    for name, patch in _ENGINE_FAILURE_PATCHES.items():
        _patch_when_imported(name, patch)


def _patch_when_imported(name: str, patch: Callable[[ModuleType], None]) -> None:
    module = sys.modules.get(name)
    if module is None:
        sys.meta_path.insert(0, _PatchAfterImport(name, patch))
    else:
        patch(module)
