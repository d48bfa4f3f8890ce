"""What the set-up's ``.pth`` file runs as every interpreter of the venv starts,
before vLLM or transformers import anything: the torchvision finder
(``torchvision_import``) and, in CPU emulation, no triton (``triton_import``)."""

from vllm_hpu.patches import torchvision_import, triton_import

torchvision_import.install()
triton_import.hide_triton()
