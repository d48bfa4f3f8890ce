"""vLLM's engine arguments: ``--device hpu``, the options a user set (recorded
on the config for every pass of the platform's hook), and the KV transfer check
on the finished config."""

import argparse
import dataclasses
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

# --device / device=.
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
            f"--device {value}: vLLM has no --device option (since 0.11) and picks its "
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
    from vllm_hpu.patches.eplb_config import with_eplb

    engine_args.create_engine_config = _with_kv_transfer_check(  # type: ignore[method-assign]
        with_eplb(_with_requested_options(engine_args.create_engine_config))
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
# caller's process, the plugin checks it (kv_transfer/connectors.py): refuses the
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
        from vllm_hpu.kv_transfer import connectors as kv_transfer

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


class PatchAfterImport(importlib.abc.MetaPathFinder):
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


def patch_when_imported(name: str, patch: Callable[[ModuleType], None]) -> None:
    """``patch`` applied to module ``name`` now if it is imported, else right
    after its import."""
    module = sys.modules.get(name)
    if module is None:
        sys.meta_path.insert(0, PatchAfterImport(name, patch))
    else:
        patch(module)


def accept_device_option() -> None:
    """Idempotent; safe to call while vLLM is being imported. Called from the
    platform entry point, and again from the general plugin, which vLLM's CLI
    loads before building its parser (at import, ``arg_utils`` may be half-run)."""
    arg_utils = sys.modules.get(ARG_UTILS)
    if arg_utils is None:
        if not any(getattr(f, "name", None) == ARG_UTILS for f in sys.meta_path):
            sys.meta_path.insert(0, PatchAfterImport(ARG_UTILS, _patch_engine_args))
    elif hasattr(arg_utils, "AsyncEngineArgs"):
        _patch_engine_args(arg_utils)
