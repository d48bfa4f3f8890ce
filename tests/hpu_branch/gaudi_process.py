"""A fresh Python on the Gaudi branch: for what is fixed when the bridge or
the plugin is imported (lazy mode, card generation, cards, front ends).

tests/hpu_branch runs only in the test double's lane: VLLM_HPU_DOUBLE=1 pytest
tests/hpu_branch (make test-hpu-double); tests/conftest.py leaves it out of the
suite otherwise. (No conftest.py here: tests/e2e imports the suite's as
``conftest``.)"""

import os
import subprocess
import sys
import textwrap


def run_python(script: str, timeout: int = 300, **env: str | None) -> str:
    """``script`` in a fresh Python on the Gaudi branch (the double on its path,
    as this process has it) with ``env`` set (None: unset): its stdout; a
    failure shows its stderr."""
    environment = {**os.environ, **env}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env={name: value for name, value in environment.items() if value is not None},
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
