"""Log lines that read as failures and are not, dropped at their loggers."""

import functools
import logging
import re
from collections.abc import Callable

import torch

# Why: every process of a normal start printed them: torchao (with INC) fails to
# load CUDA kernels no CPU or Gaudi path calls and registers two enums the
# deprecated way; vLLM warns that Model Runner V2 needs Triton (we run neither
# runner), that "user settings" disabled Inductor (the platform did), and once per
# float32 weight run in 16 bits (already said once at start-up).
# How: a filter on each emitting logger drops exactly those records.
# Upstream change that removes it: torchao loading CUDA kernels only with CUDA
# torch and registering opaque enums; vLLM not warning about choices the platform
# made, nor per weight about the model's dtype.
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
