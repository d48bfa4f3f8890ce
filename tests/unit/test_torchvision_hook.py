"""The set-up's import hook: PyPI's CUDA-built torchvision imports beside the CPU
torch in a fresh interpreter of the venv, before any plugin code runs."""

import subprocess
import sys

import pytest


@pytest.mark.slow  # a fresh interpreter imports torch and torchvision
def test_fresh_interpreter_imports_torchvision_before_the_plugin():
    code = (
        "import sys\n"
        "hook = sys.modules['vllm_hpu.patches.torchvision_import']  # the .pth's\n"
        "assert 'torch' not in sys.modules  # the hook alone imports no torch\n"
        "import torchvision.transforms.v2.functional\n"
        "assert hook.allow_torchvision_import.cache_info().currsize  # it ran first\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
