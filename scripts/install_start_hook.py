"""Set-up step: a ``.pth`` file in the venv that runs the plugin's interpreter-start
patches in every process, before vLLM or transformers import anything
(vllm_hpu/patches/interpreter_start.py: PyPI's CUDA-built torchvision imports
beside the CPU torch; no triton in CPU emulation)."""

import sysconfig
from pathlib import Path

PTH = Path(sysconfig.get_paths()["purelib"]) / "vllm_hpu_torchvision.pth"

if __name__ == "__main__":
    PTH.write_text("import vllm_hpu.patches.interpreter_start\n")
    print(f"wrote {PTH}")
