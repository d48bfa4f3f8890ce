"""Sleep mode's bookkeeping (worker/capabilities/sleep.py) on a plain module:
which tensors wait on the host at each level, that the model keeps its own
tensor objects, and that the weights and the KV cache wake separately."""

import pytest
import torch

from vllm_hpu.emulation import device_memory as emulated_memory
from vllm_hpu.worker.capabilities.sleep import HpuSleepMode


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 4)
        self.head = torch.nn.Linear(4, 8, bias=False)
        self.register_buffer("table", torch.arange(6.0), persistent=False)


class _KVCache:
    def __init__(self) -> None:
        self.bound = True

    def release(self) -> None:
        self.bound = False

    def restore(self) -> None:
        self.bound = True


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    tensors = [*model.named_parameters(), *model.named_buffers()]
    return {name: tensor.detach().clone() for name, tensor in tensors}


def test_level_1_keeps_the_weights_on_the_host_and_wakes_by_tag() -> None:
    model, kv, sleep = _Model(), _KVCache(), HpuSleepMode([])
    state, weight = _state(model), model.proj.weight
    on_host = emulated_memory.meter().on_host
    sleep.sleep(1, [model], kv.release)
    assert not kv.bound and sleep.asleep == {"weights", "kv_cache"}
    assert all(t.numel() == 0 for t in [*model.parameters(), *model.buffers()])
    assert emulated_memory.meter().on_host - on_host >= 4 * (8 * 4 + 4 + 4 * 8 + 6)
    with pytest.raises(RuntimeError, match="wake_up\\(tags=\\['weights'\\]\\)"):
        sleep.check_awake("update_weights")

    sleep.wake_up(["weights"], kv.restore)
    assert sleep.asleep == {"kv_cache"} and not kv.bound
    assert model.proj.weight is weight  # the model's own tensor, refilled
    for name, value in _state(model).items():
        assert torch.equal(value, state[name]), name
    sleep.wake_up(["kv_cache"], kv.restore)
    assert kv.bound and not sleep.asleep
    assert emulated_memory.meter().on_host == on_host


def test_level_2_drops_the_parameters_but_keeps_buffers_and_preserved() -> None:
    model, kv = _Model(), _KVCache()
    sleep = HpuSleepMode(["head.*"])
    state = _state(model)
    sleep.sleep(2, [model], kv.release)
    kept = [tuple(a.shape) for a in sleep._weights if a.host is not None]
    assert sorted(kept) == [(6,), (8, 4)]  # the buffer and head.weight (preserved)
    sleep.wake_up(None, kv.restore)
    assert kv.bound and not sleep.asleep
    assert model.proj.weight.shape == (4, 8)  # allocated for a reload
    assert torch.equal(model.head.weight, state["head.weight"])
    assert torch.equal(model.table, state["table"])


def test_discard_and_bad_requests() -> None:
    model, kv, sleep = _Model(), _KVCache(), HpuSleepMode([])
    sleep.discard(("kv_cache",), kv.release)
    assert not kv.bound and sleep.asleep == {"kv_cache"}
    with pytest.raises(ValueError, match="Only the KV cache"):
        sleep.discard(("weights",), kv.release)
    sleep.wake_up(["kv_cache"], kv.restore)
    with pytest.raises(ValueError, match="level 3"):
        sleep.sleep(3, [model], kv.release)
    with pytest.raises(ValueError, match="Unknown sleep tags"):
        sleep.wake_up(["graphs"], kv.restore)
