"""The start-up log filters (patches.py, patch 7) drop exactly the known-harmless
records; anything else the same loggers say still shows."""

import enum
import logging

import pytest
import torch

from vllm_hpu.patches import log_records

TORCHAO_KERNEL = (
    "Failed to load /venv/site-packages/torchao/_C_mxfp8.cpython-310-x86_64-linux"
    "-gnu.so: Could not load this library: /venv/site-packages/torchao/_C_mxfp8.so"
)
PYTREE_DEPRECATION = (
    "%s is an Enum subclass and is now natively supported by torch.compile as an "
    "opaque value type. Calling register_constant() on Enum subclasses is deprecated"
)


NARROWING = "Attempted to load weight %s with dtype %s into parameter with dtype %s"


class TorchaoEnum(enum.Enum):
    A = 1


TorchaoEnum.__module__ = "torchao.quantization.quantize_"


class OtherEnum(enum.Enum):
    A = 1


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def shown(logger_name: str, message: str, *args: object) -> bool:
    """Whether ``message`` logged on ``logger_name`` reaches its handlers."""
    logger = logging.getLogger(logger_name)
    recorder = Recorder()
    logger.addHandler(recorder)
    try:
        logger.warning(message, *args)
    finally:
        logger.removeHandler(recorder)
    return bool(recorder.messages)


@pytest.fixture(autouse=True)
def filters():
    log_records.drop_harmless_log_records()


def test_torchao_cuda_kernels_are_dropped_other_failures_kept(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    assert not shown("torchao", TORCHAO_KERNEL)
    assert shown("torchao", "Failed to load /venv/site-packages/other/_C.so: x")
    assert shown("torchao", "Skipping import of cpp extensions due to x")


def test_torchao_cuda_kernels_show_under_a_cuda_torch(monkeypatch):
    """Under a CUDA build of torch (make test-gaudi-torch's 2.11) those kernels
    should load: a failure to is news, kept."""
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert shown("torchao", TORCHAO_KERNEL)


def test_only_torchaos_enum_registrations_are_dropped():
    assert not shown("torch.utils._pytree", PYTREE_DEPRECATION, TorchaoEnum)
    assert shown("torch.utils._pytree", PYTREE_DEPRECATION, OtherEnum)


def test_vllm_runner_and_compilation_notices_are_dropped_others_kept():
    logger = "vllm.config.vllm"
    assert not shown(logger, "Model Runner V2 requires Triton; using the V1 one.")
    assert not shown(logger, "Inductor compilation was disabled by user settings, x")
    assert shown(logger, "Turing devices tensor cores do not support float32 matmul.")


def test_float32_weights_into_the_16_bit_model_are_dropped_other_mismatches_kept():
    """The model's dtype is said once at start-up; a weight that narrows
    otherwise (fp16 into fp8, say) or a widening still shows."""
    logger = "vllm.model_executor.models.utils"
    assert not shown(logger, NARROWING, "lm_head.weight", torch.float32, torch.bfloat16)
    assert not shown(logger, NARROWING, "norm.weight", torch.float32, torch.float16)
    assert shown(logger, NARROWING, "w", torch.bfloat16, torch.float8_e4m3fn)
    assert shown(logger, NARROWING, "w", torch.float64, torch.bfloat16)
    assert shown(logger, "Attempted to load nested weight 'x' into a single parameter")
