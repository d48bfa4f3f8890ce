"""scripts/check_no_cuda.py --allow-torch-cuda (make test-gaudi-torch): the CUDA
packages torch's own metadata requires pass, any other CUDA package still fails."""

import sys
from pathlib import Path

import packaging.requirements  # noqa: F401 (imported before sys.path is replaced)
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import check_no_cuda

# As PyPI's torch 2.11.0 declares them: plain, under a platform marker, and through
# an extra of a CUDA package whose own requirement needs that extra.
TORCH_REQUIRES = (
    "nvidia-cublas==13.0.0.19",
    'nvidia-cudnn-cu13==9.19.0.56; platform_system == "Linux"',
    "cuda-toolkit[cufft]==13.0.2",
    'numpy; extra == "numpy"',
)
CUDA_TOOLKIT_REQUIRES = ('nvidia-cufft==12.0.0.61; extra == "cufft"',)


def dist(site: Path, name: str, requires: tuple[str, ...] = ()) -> None:
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    lines = [
        f"Name: {name}",
        "Version: 1.0",
        *(f"Requires-Dist: {r}" for r in requires),
    ]
    (info / "METADATA").write_text("\n".join(["Metadata-Version: 2.1", *lines]) + "\n")


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A CUDA torch's metadata and its CUDA packages."""
    dist(tmp_path, "torch", TORCH_REQUIRES)
    dist(tmp_path, "cuda-toolkit", CUDA_TOOLKIT_REQUIRES)
    for name in ("nvidia-cublas", "nvidia-cudnn-cu13", "nvidia-cufft"):
        dist(tmp_path, name)
    # Only these (the venv running the test may hold a CUDA torch's packages).
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    monkeypatch.setattr(check_no_cuda, "torch_cuda_version", lambda: "13.0")
    return tmp_path


def check(monkeypatch, *flags: str) -> int:
    monkeypatch.setattr(sys, "argv", ["check_no_cuda.py", *flags])
    return check_no_cuda.main()


def test_torch_requirements_followed_through_markers_and_extras(site):
    assert check_no_cuda.torch_cuda_runtime() == {
        "nvidia-cublas",
        "nvidia-cudnn-cu13",
        "cuda-toolkit",
        "nvidia-cufft",
    }


def test_torchs_own_cuda_packages_pass_only_when_allowed(site, monkeypatch, capsys):
    assert check(monkeypatch, "--allow-torch-cuda") == 0
    assert "only torch's own CUDA packages (4)" in capsys.readouterr().out
    assert check(monkeypatch) == 1
    errors = capsys.readouterr().err
    assert "CUDA package installed: nvidia-cublas" in errors
    assert "torch is a CUDA build (CUDA 13.0)" in errors


def test_another_cuda_package_fails_even_when_allowed(site, monkeypatch, capsys):
    dist(site, "nvidia-nccl-cu13")  # vLLM's, not torch's
    assert check(monkeypatch, "--allow-torch-cuda") == 1
    errors = capsys.readouterr().err
    assert errors.strip() == "check_no_cuda: CUDA package installed: nvidia-nccl-cu13"
