"""House rules: one module touches Gaudi, one module reads the environment."""

import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "vllm_hpu"


def _offenders(pattern: str, allowed: str) -> list[str]:
    regex = re.compile(pattern)
    return sorted(
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if path.name != allowed or path.parent != PACKAGE
        if regex.search(path.read_text())
    )


def test_seam_only_device_module_touches_habana():
    assert _offenders(r"habana_frameworks|torch\.hpu", "device.py") == []


def test_seam_only_envs_module_reads_environment():
    assert _offenders(r"os\.environ|os\.getenv", "envs.py") == []
