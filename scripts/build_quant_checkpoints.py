"""Write the compressed-tensors checkpoints the quantization tests read, with the
format's own tool, llm-compressor.

llm-compressor 0.14 needs compressed-tensors 0.19 while vLLM 0.32 pins 0.17, so
both are installed apart from the venv (``pip install --no-deps --target
TOOLS_DIR``) and run in a child process with TOOLS_DIR first on its path; that
process only writes checkpoints (scripts/llmcompressor_checkpoints.py) into
MODELS_DIR, beside the tiny models they quantize. Idempotent: the tools are
installed once, a checkpoint is rewritten only when its build version changes.

Usage: build_quant_checkpoints.py MODELS_DIR [TOOLS_DIR]
(TOOLS_DIR defaults to quant-tools beside MODELS_DIR).
"""

import os
import subprocess
import sys
from pathlib import Path

# llm-compressor's newest release, the compressed-tensors it pins, and the NVML
# bindings it imports (it runs on the CPU: "No accelerator available!").
TOOLS = (
    "llmcompressor==0.14.0.1",
    "compressed-tensors==0.19.0",
    "nvidia-ml-py==13.615.71",
)
WRITER = Path(__file__).with_name("llmcompressor_checkpoints.py")


def install_tools(tools_dir: Path) -> None:
    stamp = tools_dir / ".installed"
    if stamp.exists() and stamp.read_text() == " ".join(TOOLS):
        return
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
    subprocess.run([*pip, "--upgrade", "--target", str(tools_dir), *TOOLS], check=True)
    stamp.write_text(" ".join(TOOLS))


def run_writer(tools_dir: Path, *args: str) -> None:
    """llmcompressor_checkpoints.py with ``args``, in a child process whose path
    starts with the tools."""
    install_tools(tools_dir)
    env = dict(os.environ, PYTHONPATH=str(tools_dir))
    subprocess.run([sys.executable, str(WRITER), *args], env=env, check=True)


def main(models_dir: Path, tools_dir: Path) -> None:
    run_writer(tools_dir, str(models_dir))


if __name__ == "__main__":
    models = Path(sys.argv[1])
    tools = Path(sys.argv[2]) if len(sys.argv) > 2 else models.parent / "quant-tools"
    main(models, tools)
