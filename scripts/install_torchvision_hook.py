"""Set-up step: a ``.pth`` file in the venv that imports the torchvision patch at
interpreter start, so PyPI's CUDA-built torchvision imports beside the CPU torch
in every process, also before the plugin loads
(vllm_hpu/patches/torchvision_import.py)."""

import sysconfig
from pathlib import Path

PTH = Path(sysconfig.get_paths()["purelib"]) / "vllm_hpu_torchvision.pth"

if __name__ == "__main__":
    PTH.write_text("import vllm_hpu.patches.torchvision_import\n")
    print(f"wrote {PTH}")
