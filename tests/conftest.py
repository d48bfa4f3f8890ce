"""Test-wide set-up: emulation on, models from the local cache, no hub."""

import logging
import os
import pathlib

import pytest

# Emulation must be on before vLLM is imported anywhere (spawned engine
# processes find the plugin again through its entry point and read this too).
os.environ.setdefault("VLLM_HPU_EMULATION", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

MODELS_DIR = pathlib.Path(__file__).resolve().parent.parent / ".cache" / "models"


class LogRecorder(logging.Handler):
    """Records of the ``vllm`` logger tree (the plugin's ``vllm.hpu.*`` included).

    Attached to the ``vllm`` logger itself, so it sees every record whatever
    handlers, propagation or captured streams earlier tests left behind.
    """

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self, level: int = logging.INFO) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno >= level]

    def take(self, level: int = logging.INFO) -> list[str]:
        """The messages so far, forgetting them."""
        messages = self.messages(level)
        self.records.clear()
        return messages


@pytest.fixture
def vllm_log():
    recorder = LogRecorder()
    logger = logging.getLogger("vllm")
    level = logger.level
    # Until vLLM configures its logging (at engine start), INFO would be dropped.
    logger.setLevel(min(logger.getEffectiveLevel(), logging.INFO))
    logger.addHandler(recorder)
    yield recorder
    logger.removeHandler(recorder)
    logger.setLevel(level)
