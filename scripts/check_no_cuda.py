"""Fail when the running environment holds CUDA packages or a CUDA build of torch.

vLLM's own requirements pull these in unless installed with --no-deps. CPU emulation
must not depend on CUDA by accident (a CUDA torch hides such mistakes; the Makefile
runs this after each set-up), and on Gaudi they mean pip replaced Habana's torch
(Dockerfile.hpu runs this last).

With --allow-torch-cuda (make test-gaudi-torch, whose torch 2.11 exists on PyPI only
as a CUDA build) torch may be that build, with the CUDA packages its own metadata
requires; any other CUDA package (one that vLLM or a test package pulled in) fails.
"""

import argparse
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


def is_cuda_package(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in CUDA_PACKAGE_PATTERNS)


def cuda_packages() -> list[str]:
    # A broken install can leave a dist-info folder without a name: skip it.
    dists = importlib.metadata.distributions()
    names = {normalize(d.metadata["Name"]) for d in dists if d.metadata["Name"]}
    return sorted(name for name in names if is_cuda_package(name))


def torch_cuda_runtime() -> set[str]:
    """The CUDA packages torch requires, and theirs (extras followed)."""
    from packaging.requirements import Requirement

    found: set[str] = set()
    todo: list[tuple[str, frozenset[str]]] = [("torch", frozenset())]
    seen = set(todo)
    while todo:
        name, extras = todo.pop()
        try:
            lines = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in lines:
            req = Requirement(line)
            wanted = extras | {""}
            marker = req.marker
            if marker and not any(marker.evaluate({"extra": e}) for e in wanted):
                continue
            dep = (normalize(req.name), frozenset(req.extras))
            if is_cuda_package(dep[0]) and dep not in seen:
                found.add(dep[0])
                seen.add(dep)
                todo.append(dep)
    return found


def torch_cuda_version() -> str | None:
    """torch's CUDA version; None for a CPU or Habana build, or no torch at all."""
    try:
        import torch
    except ImportError:
        return None
    return torch.version.cuda


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--allow-torch-cuda", action="store_true")
    allow_torch_cuda = parser.parse_args().allow_torch_cuda
    allowed = torch_cuda_runtime() if allow_torch_cuda else set()
    names = [name for name in cuda_packages() if name not in allowed]
    problems = [f"CUDA package installed: {name}" for name in names]
    cuda = torch_cuda_version()
    if cuda is not None and not allow_torch_cuda:
        problems.append(f"torch is a CUDA build (CUDA {cuda})")
    for problem in problems:
        print(f"check_no_cuda: {problem}", file=sys.stderr)
    if not problems and allowed:
        print(f"check_no_cuda: only torch's own CUDA packages ({len(allowed)})")
    elif not problems:
        print("check_no_cuda: no CUDA packages, torch is not a CUDA build")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
