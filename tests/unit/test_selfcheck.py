"""``python -m vllm_hpu.selfcheck`` without a Gaudi, and its version table
against README_GAUDI.md's. (On the Gaudi branch: tests/hpu_branch.)"""

import pathlib
import subprocess
import sys

import pytest

from vllm_hpu import selfcheck

README_GAUDI = pathlib.Path(__file__).resolve().parents[2] / "README_GAUDI.md"
# selfcheck's package -> the first cell of README_GAUDI's version table row.
TABLE_ROWS = {
    "torch": "torch",
    "habana-torch-plugin": "Intel Gaudi software",
    "vllm": "vLLM",
    "neural-compressor-pt": "Intel Neural Compressor",
}


def test_versions_are_readme_gaudis():
    text = README_GAUDI.read_text()
    section = text.split("### Versions", 1)[1].split("\n#", 1)[0]
    rows = {
        line.split("|")[1].strip(): line.split("|")[2]
        for line in section.splitlines()
        if line.startswith("| ") and line.count("|") > 3
    }
    for package, row in TABLE_ROWS.items():
        assert selfcheck.VERSIONS[package] in rows[row], (package, rows[row])


@pytest.mark.slow  # a fresh Python
def test_without_a_gaudi_it_says_so_and_fails():
    done = subprocess.run(
        [sys.executable, "-m", "vllm_hpu.selfcheck"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1
    first, fix = done.stdout.splitlines()
    assert first.split()[:2] == ["Gaudi", "FAIL"]
    assert "VLLM_HPU_EMULATION=1" in fix and "README_GAUDI.md" in fix
