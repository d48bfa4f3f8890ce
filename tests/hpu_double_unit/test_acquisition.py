"""Card acquisition as the bridge does it (hpu/__init__.py:54-151, memory.py,
synapse_helpers/device.cpp:415-492): asking whether a card exists takes none;
the first device call or HPU tensor takes one for the life of the process, and
is recorded (HPU_DOUBLE_ACQUIRE_LOG) with who asked and from where."""

import json

from double_process import run_double

QUERIES_THEN_MEMORY = """
import torch, habana_frameworks.torch
from habana_frameworks.torch._double import native
from habana_frameworks.torch.utils.experimental import _get_device_type
torch.hpu.is_available(), torch.hpu.device_count(), _get_device_type()
print("after queries", native.is_acquired())
torch.hpu.mem_get_info()  # line 7
print("after mem_get_info", native.is_acquired())
"""


def test_queries_take_no_card_and_memory_calls_do(tmp_path):
    log = tmp_path / "acquired.jsonl"
    # Cards of its own: the lane's other processes share the default lock folder.
    out = run_double(
        QUERIES_THEN_MEMORY,
        HPU_DOUBLE_ACQUIRE_LOG=str(log),
        HPU_DOUBLE_STATE_DIR=str(tmp_path),
    )
    assert "after queries False" in out and "after mem_get_info True" in out
    (entry,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert entry["api"] == "torch.hpu.memory_stats" and entry["acquired"]
    assert entry["module_id"] == 0 and entry["argv"] == ["-c"]
    assert entry["frames"][-1] == "<string>:7 <module>"


HOLD_AND_SPAWN = """
import subprocess, sys, torch, habana_frameworks.torch
torch.hpu.get_device_name()
child = subprocess.run([sys.executable, "-c", "import torch, habana_frameworks.torch; "
                        "torch.ones(1, device='hpu')"], capture_output=True, text=True)
print("child failed:", "Device acquire failed." in child.stderr)
"""


def test_a_card_held_by_one_process_is_refused_to_another(tmp_path):
    """On a one-card host the second process cannot get a card (the review's
    D4: a front end holding a card leaves the worker none)."""
    log = tmp_path / "acquired.jsonl"
    env = {"HPU_DOUBLE_ACQUIRE_LOG": str(log), "HPU_DOUBLE_CARDS": "1"}
    out = run_double(HOLD_AND_SPAWN, HPU_DOUBLE_STATE_DIR=str(tmp_path), **env)
    assert "child failed: True" in out
    parent, child = [json.loads(line) for line in log.read_text().splitlines()]
    assert parent["acquired"] and parent["api"] == "torch.hpu.get_device_name"
    assert not child["acquired"] and child["ppid"] == parent["pid"]


def test_cards_are_visible_modules_and_hls_module_id_picks_one(tmp_path):
    out = run_double(
        """
        import torch, habana_frameworks.torch
        from habana_frameworks.torch._double import cards
        print("count", torch.hpu.device_count())
        torch.ones(1, device="hpu")
        print("module", cards.module_id())
        """,
        HPU_DOUBLE_STATE_DIR=str(tmp_path),
        HABANA_VISIBLE_MODULES="2,5",
        HLS_MODULE_ID="5",
    )
    assert "count 2" in out and "module 5" in out
