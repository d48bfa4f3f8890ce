"""Fail when the running environment holds CUDA packages or a CUDA build of torch.

vLLM's own requirements pull these in unless installed with --no-deps. CPU emulation
must not depend on CUDA by accident (a CUDA torch hides such mistakes; the Makefile
runs this after each set-up), and on Gaudi they mean pip replaced Habana's torch
(Dockerfile.hpu runs this last).
"""

import fnmatch
import importlib.metadata
import re
import sys

CUDA_PACKAGE_PATTERNS = (
    "nvidia-*",
    "cuda-*",
    "flashinfer*",
    "cutlass*",
    "humming-kernels",
    "tilelang",
    "quack",
    "cupy*",
)


def normalize(name: str) -> str:
    """PEP 503 form, so that `nvidia_cublas_cu12` matches `nvidia-*`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def cuda_packages() -> list[str]:
    # A broken install can leave a dist-info folder without a name: skip it.
    dists = importlib.metadata.distributions()
    names = {normalize(d.metadata["Name"]) for d in dists if d.metadata["Name"]}
    return sorted(
        name
        for name in names
        if any(fnmatch.fnmatchcase(name, p) for p in CUDA_PACKAGE_PATTERNS)
    )


def torch_cuda_version() -> str | None:
    """torch's CUDA version; None for a CPU or Habana build, or no torch at all."""
    try:
        import torch
    except ImportError:
        return None
    return torch.version.cuda


def main() -> int:
    problems = [f"CUDA package installed: {name}" for name in cuda_packages()]
    cuda = torch_cuda_version()
    if cuda is not None:
        problems.append(f"torch is a CUDA build (CUDA {cuda})")
    for problem in problems:
        print(f"check_no_cuda: {problem}", file=sys.stderr)
    if not problems:
        print("check_no_cuda: no CUDA packages, torch is not a CUDA build")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
