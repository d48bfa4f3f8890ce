"""The Gaudi install keeps Habana's torch: Dockerfile.hpu pins the image's torch-bound
packages for every pip step, and pip resolves requirements-hpu.txt against the
image's torch without replacing it (D1 of the Gaudi contract review).

The resolution asks the package index (PyPI) for metadata, as the set-up itself does."""

import json
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile.hpu"
REQUIREMENTS_HPU = ROOT / "requirements-hpu.txt"
IMAGE_TAG = re.compile(
    r"gaudi-docker/(?P<gaudi>\d+\.\d+)\.\d+/[^/]+/habanalabs/"
    r"pytorch-(?:upstream-)?installer-(?P<torch>\d+\.\d+\.\d+):"
)
# Intel Neural Compressor's own map (docs/source/gaudi_version_map.md in
# intel/neural-compressor at 9b47d09): Gaudi software version -> INC releases.
INC_FOR_GAUDI = {
    "1.22": ("3.5", "3.6", "3.7"),
    "1.23": ("3.7.1",),
    "1.24": ("3.8.1",),
}
# Distributions built against the image's torch: pip must install none of them.
TORCH_BOUND = re.compile(
    r"^(torch|torchvision|torchaudio|habana-.*|nvidia-.*|cuda-.*)$"
)
# `pip list --format=freeze` lines as a 1.24.1 PyTorch image prints them
# (torch and torchvision as pinned by a public Dockerfile on that image).
IMAGE_FREEZE = {
    "torch==2.11.0a0+git009b5f6": True,
    "torchvision==0.26.0+cpu": True,
    "habana-torch-plugin==1.24.1.482": True,
    "habana_gpu_migration==1.24.1.482": True,
    "torch-tb-profiler==0.4.3": False,
    "numpy==1.26.4": False,
    "neural_compressor_pt==3.8.1": False,
}


def base_image() -> re.Match:
    default = re.search(r"^ARG BASE_IMAGE=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert default, "Dockerfile.hpu names no default BASE_IMAGE"
    tag = IMAGE_TAG.search(default.group(1))
    assert tag, f"not a Gaudi PyTorch image: {default.group(1)}"
    return tag


def image_torch_versions() -> tuple[str, str]:
    """The torch versions an image of that tag reports: Habana's own build is a
    pre-release of the next version (`2.11.0a0+git009b5f6` on 1.24.1), the
    `pytorch-upstream-installer` image's is the release itself."""
    torch = base_image().group("torch")
    return f"{torch}a0+git0000000", torch


def dockerfile_runs() -> list[str]:
    """Each RUN instruction of Dockerfile.hpu, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [line[4:] for line in text.splitlines() if line.startswith("RUN ")]


def test_dockerfile_constrains_every_pip_install():
    runs = dockerfile_runs()
    writes = [i for i, run in enumerate(runs) if "pip list --format=freeze" in run]
    installs = [i for i, run in enumerate(runs) if "pip install" in run]
    assert writes and installs and writes[0] < installs[0], (
        "the image's constraints must be written from `pip list` before the first "
        "pip install"
    )
    for run in runs:
        for step in run.split("&&"):
            if "pip install" in step:
                assert '-c "$GAUDI_CONSTRAINTS"' in step, f"unconstrained: {step}"


def test_dockerfile_constraints_keep_the_image_torch():
    pattern = re.search(r"grep -i -E '([^']+)'", " ".join(dockerfile_runs()))
    assert pattern, "Dockerfile.hpu does not select the image's packages with grep -E"
    keeps = re.compile(pattern.group(1), re.I)
    for line, kept in IMAGE_FREEZE.items():
        assert bool(keeps.search(line)) == kept, line


def test_inc_pin_follows_inc_gaudi_map():
    text = REQUIREMENTS_HPU.read_text()
    pins = re.findall(r"^neural-compressor-pt==(\S+)$", text, re.M)
    gaudi = base_image().group("gaudi")
    assert pins and pins[0] in INC_FOR_GAUDI.get(gaudi, ()), (
        f"neural-compressor-pt {pins} is not INC's release for Gaudi {gaudi}: "
        f"{INC_FOR_GAUDI.get(gaudi)}"
    )


def image_environment(path: Path, torch_version: str) -> Path:
    """An interpreter whose only installed distribution is the image's torch."""
    venv.EnvBuilder(with_pip=False).create(path)
    site_packages = next(path.glob("lib/python*/site-packages"))
    dist_info = site_packages / f"torch-{torch_version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: torch\nVersion: {torch_version}\n"
    )
    (dist_info / "INSTALLER").write_text("pip\n")
    (dist_info / "RECORD").write_text("")
    return path / "bin" / "python"


def resolve(python: Path, report: Path) -> list[dict]:
    """What `pip install -r requirements-hpu.txt` would install into `python`'s
    environment, unconstrained: pip may replace torch here, and the test says so."""
    command = [sys.executable, "-m", "pip", "--python", str(python), "install"]
    command += ["--dry-run", "--quiet", "--report", str(report)]
    command += ["-r", str(REQUIREMENTS_HPU)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(report.read_text())["install"]


def torch_requirements(item: dict) -> list[Requirement]:
    requirements = (Requirement(r) for r in item["metadata"].get("requires_dist", []))
    return [
        r
        for r in requirements
        if r.name == "torch" and (r.marker is None or r.marker.evaluate({"extra": ""}))
    ]


def unmet_torch_requirements(install: list[dict], versions: tuple[str, ...]) -> list:
    """`name requires torch...` for each package to be installed whose torch
    requirement one of ``versions`` does not meet."""
    return [
        f"{item['metadata']['name']} requires {requirement}, not {version}"
        for item in install
        for requirement in torch_requirements(item)
        for version in versions
        if not requirement.specifier.contains(version, prereleases=True)
    ]


@pytest.mark.slow
def test_requirements_hpu_keep_the_image_torch(tmp_path):
    habana_torch, upstream_torch = image_torch_versions()
    python = image_environment(tmp_path / "image", habana_torch)
    install = resolve(python, tmp_path / "report.json")
    replaced = [
        f"{i['metadata']['name']}=={i['metadata']['version']}"
        for i in install
        if TORCH_BOUND.match(canonicalize_name(i["metadata"]["name"]))
    ]
    assert not replaced, (
        f"pip would replace the image's torch {habana_torch}: {replaced}"
    )
    assert not unmet_torch_requirements(install, (habana_torch, upstream_torch))
