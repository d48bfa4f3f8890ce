"""The main job's command prints no line that reads as a failure, and needs none
of the test layer's packages.

``examples/offline_inference.py`` runs as ``make run`` runs it (the engine in its
own process), on a tiny model, with the packages of requirements-test.txt hidden
from every process: what its whole output says is checked line by line.
"""

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

from models import model_path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "offline_inference.py"
TEST_REQUIREMENTS = ROOT / "requirements-test.txt"
CHILD_TIMEOUT_S = 600  # imports vLLM twice and starts an engine on 2 busy cores
# What reads as a failure: glog-style warning/error prefixes (torch's "W1126
# 05:38:10.39 ..."), log levels, Python's warning and exception names, and the words.
ALARMING = re.compile(
    r"^[WEF]\d{4} "
    r"|\b(WARNING|ERROR|CRITICAL)\b"
    r"|\w*(Warning|Error|Exception)\b"
    r"|(?i:\b(fail|failed|failure|errors?|traceback|deprecated|deprecation)\b)"
)
DTYPE_LINE = "Emulation runs the model in "


def normalize(name: str) -> str:
    """A distribution's name in PEP 503 form."""
    return re.sub(r"[-_.]+", "-", name).lower()


def modules_of_test_layer() -> list[str]:
    """Top-level modules of the packages requirements-test.txt names."""
    names = set()
    for line in TEST_REQUIREMENTS.read_text().splitlines():
        requirement = line.split("#")[0].strip()
        if requirement:
            names.add(normalize(re.split(r"[<>=!~;\[ ]", requirement)[0]))
    return sorted(
        module
        for module, dists in importlib.metadata.packages_distributions().items()
        if any(normalize(d) in names for d in dists) and not module.startswith("_")
    )


def hide_modules(folder: Path, modules: list[str]) -> None:
    """A sitecustomize that makes ``modules`` unimportable (find_spec answers None,
    as for a package that is not installed) in every process started with
    ``folder`` on PYTHONPATH."""
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(
        f"import sys\nsys.modules.update(dict.fromkeys({modules!r}))\n"
    )


def test_main_job_start_reads_clean_without_the_test_layer(tmp_path):
    hidden = modules_of_test_layer()
    assert {"pytest", "ray", "peft", "lm_eval", "numba"} <= set(hidden)
    hide_modules(tmp_path / "hide", hidden)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tmp_path / "hide"), *filter(None, [env.get("PYTHONPATH")])]
    )
    env["VLLM_HPU_EMULATION_MEMORY_GB"] = "1"  # a small KV cache
    command = [sys.executable, str(EXAMPLE), "--model", model_path("tiny-llama")]
    run = subprocess.run(
        [*command, "--max-tokens", "4"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    lines = run.stdout.splitlines()
    assert run.returncode == 0, run.stdout[-4000:]
    assert [line for line in lines if line.startswith("Generated ")]
    # Generated text is the model's (random words), not the log's.
    log = [line for line in lines if not line.startswith("Generation: ")]
    assert [line for line in log if ALARMING.search(line)] == []
    assert len([line for line in log if DTYPE_LINE in line]) == 1
