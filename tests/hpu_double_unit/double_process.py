"""A fresh Python with the bridge's test double on its path: for what is fixed
when the bridge is imported (lazy mode, card generation, cards, memory)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HPU_DOUBLE = Path(__file__).resolve().parents[1] / "hpu_double"


def run_double(script: str, timeout: int = 300, **env: str) -> str:
    """Runs ``script`` in a fresh Python with the double on its path and ``env``
    added to the environment; its stdout, or a failure with its stderr."""
    environment = {**os.environ, "PYTHONPATH": str(HPU_DOUBLE), **env}
    environment.pop("VLLM_HPU_EMULATION", None)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"the script failed:\n{done.stderr[-3000:]}")
    return done.stdout
