"""Test-wide set-up: emulation on, models from the local cache, no hub."""

import os
import pathlib

# Emulation must be on before vLLM is imported anywhere (spawned engine
# processes find the plugin again through its entry point and read this too).
os.environ.setdefault("VLLM_HPU_EMULATION", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

MODELS_DIR = pathlib.Path(__file__).resolve().parent.parent / ".cache" / "models"
