"""The plugin's calls into Habana's stack, each against the published bridge as
the double models it: the review's items (README_GAUDI.md, "How the Gaudi
branch is tested") that one call settles. The kernels themselves are checked
by the self-check's table (test_selfcheck.py); whole engines by
test_engines.py."""

import json

import pytest
import torch
from gaudi_process import run_python

import vllm_hpu
from vllm_hpu import device


@pytest.fixture(scope="module", autouse=True)
def plugin_ops():
    """The plugin's patches and ops, as vLLM loads them in every process."""
    vllm_hpu.register_ops()


def test_synced_weight_loader_loads_a_device_parameter():
    """U1: vLLM's ``torch._sync`` asserts on a plain HPU tensor (it is XLA's
    functional-tensor sync); the device is synchronized instead."""
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    from vllm_hpu.platform import HpuPlatform

    loader = HpuPlatform.make_synced_weight_loader(default_weight_loader)
    param = torch.nn.Parameter(torch.zeros(4, device="hpu"), requires_grad=False)
    loader(param, torch.arange(4.0))
    assert param.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_vllm_cache_calls_run_on_gaudi():
    """D2: vLLM's loader and shutdown empty torch.accelerator's caches, which
    Habana's allocator refuses ("Allocator for hpu is not a DeviceAllocator")."""
    torch.ones(1, device="hpu")
    torch.accelerator.empty_cache()
    torch.accelerator.empty_host_cache()


FRONT_END = """
from vllm.engine.arg_utils import EngineArgs
from vllm.platforms import current_platform
from habana_frameworks.torch._double import native

EngineArgs.get_batch_defaults(world_size=1)
memory = current_platform.get_device_total_memory() >> 30
print(current_platform.get_device_name(), memory, native.is_acquired())
"""


@pytest.mark.parametrize(
    ("card", "expected"),
    [("gaudi2", "GAUDI2 96 False"), ("gaudi3", "GAUDI3 128 False")],
)
def test_batch_defaults_take_no_card(card, expected):
    """D4: vLLM sizes its batch defaults in the front end (API server, caller of
    LLM) from the card's name and memory; asking the bridge would acquire a card
    for the front end's life. The answer comes from the card type, which the
    bridge gives without acquiring one."""
    assert run_python(FRONT_END, HPU_DOUBLE_DEVICE=card).split() == expected.split()


def test_gaudi2_fp8_range():
    """D7: Gaudi2's e4m3 stops at 240 (values past it read as NaN): vLLM's
    activation quantizer and the plugin's quantize within it, and checkpoint
    fp8 values are halved with their scales doubled."""
    from vllm.model_executor.layers.quantization import input_quant_fp8

    from vllm_hpu.quantization.fp8 import FP8_DTYPE, fit_card_range

    assert device.card_type() == device.GAUDI2 and device.fp8_max() == 240.0
    assert (input_quant_fp8._FP8_MIN, input_quant_fp8._FP8_MAX) == (-240.0, 240.0)
    weight = torch.tensor([448.0, -256.0, 1.5, 0.0]).to(FP8_DTYPE).to("hpu")
    scale = torch.tensor(0.5, device="hpu")
    fit_card_range(weight, scale)
    assert weight.cpu().float().tolist() == [224.0, -128.0, 0.75, 0.0]
    assert scale.item() == 1.0


GAUDI3_FP8 = """
from vllm_hpu import device
from vllm_hpu.quantization.fp8 import FP8_MAX
print(device.device_name(), device.fp8_max(), FP8_MAX)
"""


def test_gaudi3_fp8_range_is_ocp_e4m3():
    assert run_python(GAUDI3_FP8, HPU_DOUBLE_DEVICE="gaudi3").split() == [
        "GAUDI3",
        "448.0",
        "448.0",
    ]


def test_logprob_ranks_count_on_gaudi():
    """D9: vLLM compiles its rank count with hpu_backend and marks the batch
    unbacked; Habana's compiler refuses symbolic sizes."""
    from vllm.v1.sample import sampler

    logprobs = torch.randn(3, 10).log_softmax(-1)
    sampled = logprobs[:, 4:5]
    on_device, sampled_on_device = logprobs.to("hpu"), sampled.to("hpu")
    torch._dynamo.decorators.mark_unbacked(on_device, 0)
    torch._dynamo.decorators.mark_unbacked(sampled_on_device, 0)
    ranks = sampler.batched_count_greater_than(on_device, sampled_on_device)
    assert ranks.cpu().tolist() == (logprobs >= sampled).sum(-1).tolist()


LAZY_MODE = """
import os, torch
from vllm_hpu import device
print("lazy", device.is_lazy(), "dynamo disabled", torch._dynamo.config.disable)
print(os.environ["PT_HPU_ENABLE_LAZY_COLLECTIVES"], os.environ["PT_HPU_WEIGHT_SHARING"])
print("runtime scale patching", os.environ.get("RUNTIME_SCALE_PATCHING"))
from vllm.model_executor.layers import vocab_parallel_embedding as embedding
ids = torch.tensor([1, 7, 12], device="hpu")
masked, mask = embedding.get_masked_input_and_mask(ids, 0, 8, 0, 0, 0)
print("vocabulary mask", masked.cpu().tolist(), mask.cpu().tolist())
"""


def test_lazy_mode_runs_no_torch_compile_and_records_collectives():
    """D10, D12: lazy mode is the bridge's answer (its published default is lazy,
    whatever the plugin's); then vLLM's compiled helpers run eagerly (no
    torch.compile in lazy mode) and collectives join the lazy graph (HPU graphs
    of more than one card need it), without the weight-sharing patch."""
    out = run_python(LAZY_MODE, PT_HPU_LAZY_MODE=None, RUNTIME_SCALE_PATCHING=None)
    assert "lazy True dynamo disabled True" in out
    assert "true 0" in out
    assert "runtime scale patching None" in out
    assert "vocabulary mask [1, 7, 0] [False, False, True]" in out


def test_eager_mode_patches_inc_scales_at_run_time():
    """D11: in eager/compile mode INC patches its scales at run time, as the
    reference plugin sets (RUNTIME_SCALE_PATCHING=1), unless the user chose."""
    lines = LAZY_MODE.split("from vllm.model_executor")[0]
    out = run_python(lines, PT_HPU_LAZY_MODE="0", RUNTIME_SCALE_PATCHING=None)
    assert "lazy False dynamo disabled False" in out
    assert "runtime scale patching 1" in out


# QUANTIZE with unit scales: no measurement files to write first.
INC_CONFIGS = {
    "MEASURE": {"mode": "MEASURE", "observer": "maxabs"},
    "QUANTIZE": {"mode": "QUANTIZE", "scale_method": "unit_scale"},
}


@pytest.mark.parametrize("mode", INC_CONFIGS)
def test_inc_marks_scales_as_graph_constants(mode, monkeypatch, tmp_path):
    """D11: once INC prepared or converted the model, its scales become graph
    constants through the bridge's hpu_initialize, as the reference calls it.
    INC runs its Gaudi path on the double: QUANTIZE first sets the bridge's
    quantization state (INC 3.8.1 on, bridge_signatures.json)."""
    import habana_frameworks.torch.core as htcore
    from habana_frameworks.torch.utils import experimental

    from vllm_hpu.quantization.inc import IncSettings
    from vllm_hpu.quantization.inc_flow import IncFlow

    marked = []
    bridge_call = htcore.hpu_initialize
    monkeypatch.setattr(
        htcore,
        "hpu_initialize",
        lambda *a, **kw: marked.append((a, kw, bridge_call(*a, **kw))),
    )
    monkeypatch.setattr(experimental, "quantization_state", {})
    config = tmp_path / "quant_config.json"
    dump = f"{tmp_path}/x"
    config.write_text(json.dumps({**INC_CONFIGS[mode], "dump_stats_path": dump}))
    scale_method = INC_CONFIGS[mode].get("scale_method", "maxabs_hw")
    settings = IncSettings(str(config), mode, dump, scale_method, (), False)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4)).to(torch.bfloat16)
    prepared = IncFlow(settings).apply(model.to("hpu"), torch.device("hpu"))
    assert marked == [((prepared,), {"mark_only_scales_as_const": True}, None)]
    assert type(prepared[0]).__name__ == "PatchedLinear"
    if mode == "QUANTIZE":
        assert prepared[0].weight.dtype == torch.float8_e4m3fn
        # Eager mode: run-time scale patching (RUNTIME_SCALE_PATCHING=1, set by
        # the plugin) makes INC give the bridge the scales' attributes too.
        state = experimental.quantization_state
        assert state["is_dynamic_quantization"] is False
        assert state["is_hw_aligned"] is True and "scale_hash_id" in state


def test_pinned_host_buffers():
    """U2: the bridge pins host memory for HPU (habana_eager/ops/pin_memory.cpp,
    its pinned allocator behind the accelerator hooks), so vLLM's pinned
    staging buffers are pinned and copy to the card."""
    from vllm.platforms import current_platform

    assert current_platform.is_pin_memory_available()
    staging = torch.arange(6.0, pin_memory=True)
    assert staging.is_pinned()
    assert staging.to("hpu", non_blocking=True).cpu().tolist() == staging.tolist()
