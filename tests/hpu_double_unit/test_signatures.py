"""The double against the record of the published bridge
(tests/hpu_double/bridge_signatures.json, itself checked against the bridge's
source by tests/hpu_double/verify_record.py): every recorded name exists in the
double with the recorded parameters, every operator with the recorded schema.
"""

import importlib
import importlib.metadata
import inspect
import json
from pathlib import Path

import pytest
import torch

RECORD = json.loads(
    (
        Path(__file__).resolve().parents[1] / "hpu_double/bridge_signatures.json"
    ).read_text()
)


def _resolve(dotted: str):
    """The object a dotted name stands for, as attribute access from the top
    package sees it (a package's attribute wins over a submodule of that name,
    as kernels.FusedSDPA is the class, not its module)."""
    parts = dotted.split(".")
    target = importlib.import_module(parts[0])
    for part in parts[1:]:
        if not hasattr(target, part):
            importlib.import_module(f"{target.__name__}.{part}")
        target = getattr(target, part)
    return target


def _parameters(function) -> str:
    """The parameter list as inspect prints it, without annotations."""
    bare = [
        p.replace(annotation=inspect.Parameter.empty)
        for p in inspect.signature(function).parameters.values()
    ]
    return str(inspect.Signature(bare))


@pytest.mark.parametrize("entry", RECORD["python"], ids=lambda e: e["name"])
def test_python_signature_matches_the_bridge(bridge, entry):
    function = _resolve(entry["name"])
    if entry.get("decorator") == "lazy_only":
        function = function.__wrapped__
    assert _parameters(function) == entry["signature"], (
        f"{entry['name']} differs from {entry['file']}:{entry['line']}"
    )


@pytest.mark.parametrize("entry", RECORD["enums"], ids=lambda e: e["name"])
def test_enum_members_match_the_bridge(bridge, entry):
    enum = _resolve(entry["name"])
    for member, value in entry["members"].items():
        assert getattr(enum, member).value == value


def _op(schema: str):
    name = schema.split("(")[0].removeprefix("hpu::")
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.hpu, packet), overload or "default")


@pytest.mark.parametrize("entry", RECORD["operators"], ids=lambda e: e["schema"][:60])
def test_operator_schema_matches_the_bridge(bridge, entry):
    recorded = torch._C.parse_schema(entry["schema"])
    assert str(_op(entry["schema"])._schema) == str(recorded)


def test_import_registers_what_the_bridge_registers(bridge):
    import habana_frameworks.torch.hpu as hpu

    assert torch.hpu is hpu
    assert torch.distributed.is_backend_available("hccl")
    assert "hpu_backend" in torch._dynamo.list_backends(exclude_tags=())
    entry_points = importlib.metadata.entry_points(group="torch.backends")
    assert any(e.value == "habana_frameworks.autoload:__autoload" for e in entry_points)


def test_rope_v1_takes_exactly_four_arguments(bridge):
    """The arity the review's D3 hinges on: V1's forward is (ctx, p, cos, sin,
    offset), so the plugin's six-argument call raises as on a Gaudi."""
    from habana_frameworks.torch.hpex.kernels import (
        RotaryPosEmbeddingHelperV1,
        RotaryPosEmbeddingMode,
    )

    x = torch.randn(3, 2, 8, device="hpu")
    cos = torch.randn(3, 1, 8, device="hpu")
    sin = torch.randn(3, 1, 8, device="hpu")
    with pytest.raises(TypeError, match="5 positional arguments but 7 were given"):
        RotaryPosEmbeddingHelperV1.apply(
            x, cos, sin, None, 0, RotaryPosEmbeddingMode.BLOCKWISE
        )
    assert RotaryPosEmbeddingHelperV1.apply(x, cos, sin, 0).shape == x.shape


def test_fp8_moe_without_its_intermediate_scales_fails(bridge):
    """The review's D6: ``d_scale_intermediate_hidden_states`` has no default in
    mixture_of_experts.fp8_fused_weights, so a call without it fails."""
    tokens, hidden, inter = 2, 8, 4
    w12 = [torch.randn(2 * inter, hidden, device="hpu").to(torch.float8_e4m3fn)]
    w3 = [torch.randn(hidden, inter, device="hpu").to(torch.float8_e4m3fn)]
    one = torch.ones((), device="hpu")
    call = dict(
        hidden_states=torch.randn(tokens, hidden, device="hpu").to(torch.float8_e4m3fn),
        expert_routing_table=torch.zeros(tokens, 1, dtype=torch.long, device="hpu"),
        router_weights=torch.ones(tokens, 1, device="hpu"),
        w12=w12,
        w3=w3,
        d_scale_hidden_states=one,
        d_scale_w12=[one],
        d_scale_w3=[one],
        permuted_weights=True,
        activation="silu",
        experts_min=0,
        experts_max=0,
    )
    moe = torch.ops.hpu.mixture_of_experts
    with pytest.raises(RuntimeError, match="d_scale_intermediate_hidden_states"):
        moe.fp8_fused_weights(**call)
    out = moe.fp8_fused_weights(**call, d_scale_intermediate_hidden_states=[one])
    assert out.dtype == torch.bfloat16 and out.shape == (tokens, hidden)
