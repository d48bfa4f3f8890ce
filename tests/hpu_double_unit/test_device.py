"""The emulated HPU is a device torch itself sees: tensors of device type "hpu"
made by factories and copies, refused beside CPU tensors as torch refuses mixed
devices, counted against the card's memory; and torch behaves as Habana's torch
where vLLM meets the difference."""

import pytest
import torch
from double_process import run_double


def test_tensors_live_on_hpu_and_copy_to_and_from_the_host(bridge):
    made = torch.arange(6, device="hpu").reshape(2, 3)
    copied = torch.tensor([[1.0, 2.0, 3.0]]).to("hpu")
    assert made.device.type == "hpu" and copied.device == torch.device("hpu", 0)
    result = made.float() * copied
    assert result.device.type == "hpu"
    torch.testing.assert_close(
        result.cpu(), torch.tensor([[0.0, 2.0, 6.0], [3.0, 8.0, 15.0]])
    )
    assert result.cpu().device.type == "cpu" and result.data_ptr() != 0


def test_views_and_in_place_writes_share_device_memory(bridge):
    cache = torch.zeros(4, 3, device="hpu")
    rows = cache[1:3]
    rows.add_(1.0)
    cache.index_copy_(
        0, torch.tensor([3], device="hpu"), torch.full((1, 3), 5.0, device="hpu")
    )
    expected = torch.tensor([[0.0] * 3, [1.0] * 3, [1.0] * 3, [5.0] * 3])
    torch.testing.assert_close(cache.cpu(), expected)
    assert rows.untyped_storage().data_ptr() == cache.untyped_storage().data_ptr()


def test_a_cpu_tensor_in_an_hpu_operator_is_refused(bridge):
    device = torch.ones(3, device="hpu")
    with pytest.raises(
        RuntimeError, match="Expected all tensors to be on the same device"
    ):
        device + torch.ones(3)
    with pytest.raises(RuntimeError, match="same device"):
        torch.matmul(torch.ones(2, 3, device="hpu"), torch.ones(3, 2))
    # A 0-dim CPU tensor is a scalar, as torch allows on every device.
    torch.testing.assert_close(
        (device * torch.tensor(2.0)).cpu(), torch.full((3,), 2.0)
    )


def test_bridge_operators_have_no_cpu_kernel(bridge):
    with pytest.raises(NotImplementedError, match="'CPU' backend"):
        torch.ops.hpu.rms_norm(torch.ones(2, 4), torch.ones(4), 1e-6)


def test_memory_is_counted_against_the_card(bridge):
    free_before, total = torch.hpu.mem_get_info()
    block = torch.empty(1 << 20, dtype=torch.uint8, device="hpu")
    free_after, _ = torch.hpu.mem_get_info()
    assert free_before - free_after == 1 << 20
    assert torch.hpu.memory_allocated() <= total - free_after
    del block
    assert torch.hpu.mem_get_info()[0] == free_before


def test_allocating_past_the_card_fails():
    out = run_double(
        """
        import torch, habana_frameworks.torch
        held = torch.empty(3 << 20, dtype=torch.uint8, device="hpu")
        try:
            torch.empty(2 << 20, dtype=torch.uint8, device="hpu")
        except torch.OutOfMemoryError as error:
            print("refused", "Allocation failed" in str(error))
        """,
        HPU_DOUBLE_MEMORY_MIB="4",
    )
    assert "refused True" in out


def test_torch_accelerator_memory_calls_fail_as_on_habanas_torch(bridge):
    """vllm-gaudi 091bbad vllm_gaudi/patches.py:5-10."""
    assert torch.accelerator.current_accelerator() == torch.device("hpu")
    with pytest.raises(
        RuntimeError, match="Allocator for hpu is not a DeviceAllocator"
    ):
        torch.accelerator.empty_cache()
    with pytest.raises(RuntimeError, match="not a DeviceAllocator"):
        torch.accelerator.memory_stats()
    assert not hasattr(torch._C, "_host_emptyCache")  # patches.py:12-13


def test_pinned_host_memory(bridge):
    pinned = torch.ones(4).pin_memory()
    assert pinned.is_pinned()
    assert torch.empty(4, pin_memory=True).is_pinned()
    assert not torch.ones(4).is_pinned()


def test_importing_torch_loads_the_bridge_outside_lazy_mode():
    """Autoload (bridge autoload/__init__.py): on unless PT_HPU_LAZY_MODE=1."""
    script = """
        import sys, torch
        print("loaded", "habana_frameworks.torch" in sys.modules)
        """
    assert "loaded True" in run_double(script, PT_HPU_LAZY_MODE="0")
    assert "loaded False" in run_double(script, PT_HPU_LAZY_MODE="1")


def test_a_replaced_torch_is_refused():
    """The bridge checks the torch it runs on (__init__.py:39-45); e.g. after pip
    replaced Habana's torch (the review's D1)."""
    out = run_double(
        """
        try:
            import habana_frameworks.torch
        except AssertionError as error:
            print(error)
        """,
        HPU_DOUBLE_TORCH_BUILT_FOR="2.7",
    )
    assert "Compile-time major/minor PyTorch version 2.7 differs" in out
