"""Emulation pools host memory: a step's tensors reuse the heap of the step before."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # a fresh process per case

# Run in a fresh process (malloc settings are process-wide): pool host memory as a
# worker does, then report from glibc's mallinfo2 what became of 24 MiB malloc'd
# and freed (mapped for itself, kept on the heap or trimmed off it) and where a
# 24 MiB tensor lives.
PROBE = """
import ctypes
import torch
from vllm_hpu import device

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd",
        "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
device.init_device_memory()
# 24 MiB from the heap's top, freed: glibc gives it back unless told to keep it.
start = libc.mallinfo2()
block = libc.malloc(24 << 20)
during = libc.mallinfo2()
libc.free(ctypes.c_void_p(block))
if during.hblkhd > start.hblkhd:
    freed = "mapped"
else:
    freed = "kept" if libc.mallinfo2().arena >= during.arena else "trimmed"
before = libc.mallinfo2()
tensor = torch.ones(24 << 20, dtype=torch.uint8)
mapped = libc.mallinfo2().hblkhd - before.hblkhd >= 24 << 20
print(freed, "mapped" if mapped else "heap")
"""


def _probe(tunables: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if tunables:
        env["GLIBC_TUNABLES"] = tunables
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[-1]


def test_pooled_host_memory_keeps_large_tensors_on_a_heap_that_never_shrinks():
    assert _probe("") == "kept heap"


@pytest.mark.parametrize(
    ("tunables", "expected"),
    [
        # glibc's trim threshold stays at its 128 KiB start: freeing trims the heap.
        ("glibc.malloc.mmap_threshold=33554432", "trimmed heap"),
        # Both at glibc's start: a tensor above 128 KiB is mapped for itself.
        ("glibc.malloc.trim_threshold=131072", "mapped mapped"),
    ],
)
def test_pooling_leaves_malloc_as_glibc_tunables_set_it(tunables, expected):
    assert _probe(tunables) == expected
