"""Test double of habana_frameworks.torch, the Habana PyTorch bridge (published
source: HabanaAI/gaudi-pytorch-bridge v1.19.0, commit 5a56187,
python_packages/habana_frameworks/torch/__init__.py).

Importing it does what importing the bridge does: it checks that torch is the
version it was built for, loads the device (here the emulated one,
csrc/hpu_device.cpp), registers ``torch.hpu`` and the "hccl" process-group
backend, and, outside lazy mode, the ``hpu_backend`` torch.compile backend.
"""

import os

# As the bridge: keeps torch.inductor from starting its compile process pool.
os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"

import habana_frameworks.autoload

habana_frameworks.autoload.is_loaded = True

import torch  # noqa: E402

from habana_frameworks.torch._double import cards, config, native, ops  # noqa: E402
from habana_frameworks.torch.utils.internal import is_lazy  # noqa: E402


def _check_torch_version() -> None:
    """The bridge refuses a torch of another major.minor than it was built for
    (__init__.py:39-45), e.g. after pip replaced Habana's torch."""
    built_for = config.config().torch_built_for
    running = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    if built_for is not None and built_for != running:
        raise AssertionError(
            f"Error: Compile-time major/minor PyTorch version {built_for} differs "
            f"from run-time {torch.__version__}."
        )


_check_torch_version()
native.load(is_lazy(), config.lazy_collectives(), cards.on_first_use)
ops.register_all()

import habana_frameworks.torch.core  # noqa: E402
import habana_frameworks.torch.distributed.hccl  # noqa: E402
import habana_frameworks.torch.hpu  # noqa: E402
