"""``python -m vllm_hpu.selfcheck`` on the Gaudi branch: every kernel the plugin
calls agrees with the plugin's CPU implementation (review items D3, D6, D8 are
rows of it), a kernel called wrongly is a failing row with its fix, and the
table has its versions and environment lines."""

import pytest
from gaudi_process import run_python

from vllm_hpu import device, selfcheck

KERNEL_ROWS = [
    "RMSNorm",
    "rotary (halves)",
    "rotary (pairs)",
    "prompt attention",
    "attention tiles",
    "experts",
    "fp8 experts (static)",
    "fp8 experts (dynamic)",
    "fp8 matmul",
]


@pytest.fixture
def vllm_config():  # type: ignore[no-untyped-def]
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()) as config:
        yield config


@pytest.fixture(scope="module")
def rows() -> dict[str, selfcheck.Row]:
    return {row.check: row for row in selfcheck.run_checks()}


@pytest.mark.parametrize("name", KERNEL_ROWS)
def test_kernel_on_the_card_equals_the_cpu(rows, name):
    assert rows[name].verdict == selfcheck.OK, rows[name]


def test_versions_and_environment_are_rows(rows):
    assert rows["vllm"].verdict == selfcheck.OK
    # The double stands for bridge 1.19.0: an untested pairing is a warning.
    assert rows["habana-torch-plugin"].verdict == selfcheck.WARN
    assert "1.24.1" in rows["habana-torch-plugin"].detail
    assert rows["Gaudi"].detail.startswith("8 x GAUDI2")
    assert rows["execution mode"].detail == "eager (PT_HPU_LAZY_MODE=0)"
    assert rows["recipe cache"].verdict == selfcheck.WARN
    assert "VLLM_HPU_CACHE_DIR" in rows["recipe cache"].fix


def test_a_kernel_called_wrongly_fails_its_row(monkeypatch, vllm_config):
    """The bridge's four-argument RoPE helper in place of the kernel the plugin
    calls (the review's D3): both rotary rows fail, with what to do."""
    from habana_frameworks.torch.hpex.kernels import RotaryPosEmbeddingHelperV1

    key = "habana_frameworks.torch.hpex.kernels.apply_rotary_pos_emb"
    monkeypatch.setitem(device._KERNELS, key, RotaryPosEmbeddingHelperV1.apply)
    checks = selfcheck.kernel_checks()
    for name in ("rotary (halves)", "rotary (pairs)"):
        row = selfcheck.kernel_row(name, *checks[name])
        assert row.verdict == selfcheck.FAIL
        assert "TypeError" in row.detail and row.fix == selfcheck.REPORT
    table = selfcheck.format_table([row])
    assert "FAIL" in table and "fix: " in table


def test_command_in_lazy_mode_on_gaudi3():
    out = run_python(
        """
        import sys
        from vllm_hpu import selfcheck
        sys.exit(selfcheck.main())
        """,
        PT_HPU_LAZY_MODE="1",
        HPU_DOUBLE_DEVICE="gaudi3",
    )
    lines = {line.split("  ")[0]: line for line in out.splitlines() if line[:1] != " "}
    assert "lazy (PT_HPU_LAZY_MODE=1)" in lines["execution mode"]
    assert "x GAUDI3" in lines["Gaudi"]
    for name in [*KERNEL_ROWS, "HPU graphs"]:
        assert f" {selfcheck.OK} " in lines[name], lines[name]
