"""``python -m vllm_hpu.selfcheck``: the first thing to run on a Gaudi. Runs each
Gaudi kernel the plugin uses once, with small shapes, through the plugin's own
call, against the CPU implementation emulation runs; checks the versions
against README_GAUDI's table and the environment (lazy or eager mode, recipe
cache, visible cards). One line per check (ok, warn, FAIL) with its fix; exit
status 1 when a line failed, including without a Gaudi."""

import copy
import dataclasses
import functools
import importlib.metadata
import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from vllm_hpu import device, envs

OK, WARN, FAIL = "ok", "warn", "FAIL"
# README_GAUDI's version table (tests/unit/test_selfcheck.py keeps them equal).
VERSIONS = {
    "torch": "2.11",
    "habana-torch-plugin": "1.24.1",
    "vllm": "0.32.0",
    "neural-compressor-pt": "3.8.1",
}
REPORT = "a kernel that disagrees with the CPU: report this table (issue tracker)"


@dataclasses.dataclass(frozen=True)
class Row:
    check: str
    verdict: str
    detail: str
    fix: str = ""


# ---- versions and environment --------------------------------------------


def _installed(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def version_rows() -> list[Row]:
    rows = []
    for package, wanted in VERSIONS.items():
        found = _installed(package)
        if found is None:
            needed = package == "neural-compressor-pt"
            rows.append(
                Row(
                    package,
                    WARN if needed else FAIL,
                    "not installed" + (" (INC's FP8 flow needs it)" if needed else ""),
                    f"pip install -c gaudi-constraints.txt {package}=={wanted}"
                    if needed
                    else "install as README_GAUDI.md says",
                )
            )
        elif found.startswith(wanted):
            rows.append(Row(package, OK, found))
        else:
            rows.append(
                Row(
                    package,
                    WARN,
                    f"{found}; README_GAUDI's table pairs {wanted}",
                    "the tested pairing is in README_GAUDI.md (Versions)",
                )
            )
    return rows


def environment_rows() -> list[Row]:
    environ = envs.process_environ()
    cards = device.card_count()
    visible = environ.get("HABANA_VISIBLE_MODULES", "all")
    rows = [
        Row("Gaudi", OK, f"{cards} x {device.device_name()} (visible: {visible})"),
        _mode_row(environ),
        _recipe_cache_row(environ),
    ]
    free, total = (n / device.GiB for n in device.mem_get_info())
    rows.append(Row("device memory", OK, f"{free:.1f} of {total:.1f} GiB free"))
    return rows


def _mode_row(environ: Any) -> Row:
    asked = environ.get("PT_HPU_LAZY_MODE", "unset")
    if not device.is_lazy():
        return Row("execution mode", OK, f"eager (PT_HPU_LAZY_MODE={asked})")
    detail = f"lazy (PT_HPU_LAZY_MODE={asked})"
    collectives = environ.get("PT_HPU_ENABLE_LAZY_COLLECTIVES", "")
    if collectives.lower() not in ("1", "true"):
        return Row(
            "execution mode",
            WARN,
            f"{detail}; PT_HPU_ENABLE_LAZY_COLLECTIVES={collectives}",
            "unset PT_HPU_ENABLE_LAZY_COLLECTIVES: more than one card needs it",
        )
    return Row("execution mode", OK, detail)


def _recipe_cache_row(environ: Any) -> Row:
    config = environ.get("PT_HPU_RECIPE_CACHE_CONFIG")
    if not config:
        return Row(
            "recipe cache",
            WARN,
            "none: every start compiles its graphs again",
            "set VLLM_HPU_CACHE_DIR to a folder kept between starts",
        )
    return Row("recipe cache", OK, config.split(",")[0])


# ---- kernels: the device through the plugin's call, against the CPU ---------

Outcome = tuple[torch.Tensor, torch.Tensor, float]  # device, CPU, tolerance
Check = Callable[[], Outcome]


def _both(
    on_device: Callable[..., Any],
    on_cpu: Callable[..., Any],
    inputs: tuple[torch.Tensor, ...],
    tolerance: float,
) -> Outcome:
    """``on_device`` on inputs moved to the card, ``on_cpu`` on them as they are."""
    got = on_device(*(t.to("hpu") for t in inputs))
    want = on_cpu(*inputs)
    if isinstance(got, tuple):
        got = torch.cat([t.flatten() for t in got])
        want = torch.cat([t.flatten() for t in want])
    return got, want, tolerance


def _rms_norm() -> Outcome:
    from vllm_hpu.ops.custom_ops import HpuRMSNorm

    layer = HpuRMSNorm(64, eps=1e-6)
    layer.weight.data.uniform_(0.5, 1.5)
    on_device = copy.deepcopy(layer).to("hpu").forward_oot
    return _both(on_device, layer.forward_native, (torch.randn(6, 64),), 1e-4)


def _rotary(neox: bool) -> Check:
    def check() -> Outcome:
        from vllm_hpu.ops.custom_ops import HpuRotaryEmbedding

        rope = HpuRotaryEmbedding(64, 32, 256, 10000.0, neox, torch.float32)
        positions = torch.tensor([0, 5, 17, 255])
        inputs = (positions, torch.randn(4, 128), torch.randn(4, 64))
        on_device = copy.deepcopy(rope).to("hpu").forward_oot
        return _both(on_device, rope.forward_native, inputs, 1e-4)

    return check


def _attention_inputs() -> tuple[torch.Tensor, ...]:
    """Grouped-query attention inputs [bs, tokens, heads, size] and an additive
    causal mask [bs, 1, q, k] over 3 earlier tokens."""
    query, key, value = (torch.randn(2, 5, h, 32) for h in (4, 2, 2))
    key, value = (torch.cat((torch.randn(2, 3, 2, 32), t), 1) for t in (key, value))
    allowed = torch.ones(5, 8, dtype=torch.bool).tril(3)
    mask = torch.where(allowed, 0.0, -torch.inf).expand(2, 1, 5, 8).contiguous()
    return query, key, value, mask


def _fused_sdpa() -> Outcome:
    from vllm_hpu.ops.prompt_attention import _fused_prompt_attention as attend
    from vllm_hpu.ops.score_mods import Scoring

    kernel = device.fused_sdpa()
    assert kernel is not None, "VLLM_PROMPT_USE_FUSEDSDPA is off"
    scoring = Scoring(scale=32**-0.5)
    return _both(
        functools.partial(attend, kernel.apply, scoring=scoring),
        functools.partial(attend, device.CpuFusedSDPA.apply, scoring=scoring),
        _attention_inputs(),
        1e-4,
    )


def _sdpa_stats() -> Outcome:
    from vllm_hpu.ops.prompt_attention import _fused_tile as tile

    kernel = device.fused_sdpa_stats()
    assert kernel is not None, "VLLM_PROMPT_USE_FUSEDSDPA is off"
    return _both(
        functools.partial(tile, kernel, 32**-0.5),
        functools.partial(tile, device.cpu_sdpa_stats, 32**-0.5),
        _attention_inputs(),
        1e-4,
    )


def _routing(tokens: int = 6, experts: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    scores = torch.randn(tokens, experts).softmax(-1)
    weights, ids = scores.topk(2, dim=-1)
    return weights, ids


def _experts() -> Outcome:
    from vllm_hpu.ops.moe import experts_grouped, fused_experts

    w13, w2 = torch.randn(4, 64, 64) / 8, torch.randn(4, 64, 32) / 8
    inputs = (torch.randn(6, 64), w13, w2, *_routing())
    return _both(fused_experts, experts_grouped, inputs, 1e-4)


def _fp8_layer(where: str) -> SimpleNamespace:
    """A MoE layer of fp8 experts as the plugin's fp8 method leaves it loaded:
    [E, N, K] weights with per-row scales, static input scales."""
    from vllm_hpu.quantization.fp8 import FP8_DTYPE, FP8_MAX

    generator = torch.Generator().manual_seed(1)
    tensors = {}
    for name, shape in (("w13", (4, 64, 64)), ("w2", (4, 64, 32))):
        weight = torch.randn(shape, generator=generator) / 8
        scale = weight.abs().amax(-1, keepdim=True) / FP8_MAX
        tensors[f"{name}_weight"] = (weight / scale).to(FP8_DTYPE)
        tensors[f"{name}_weight_scale"] = scale
    tensors["w13_input_scale"] = torch.tensor(0.02)
    tensors["w2_input_scale"] = torch.tensor(0.05)
    return SimpleNamespace(
        **{name: t.to(where) for name, t in tensors.items()},
        local_num_experts=4,
        hidden_size=64,
        intermediate_size_per_partition=32,
        activation=SimpleNamespace(value="silu"),
        swiglu_alpha=None,
        swiglu_limit=None,
    )


def _fp8_experts(mode: str) -> Check:
    def check() -> Outcome:
        from vllm_hpu.quantization.fp8_moe import HpuFp8Experts

        class CpuFp8Experts(HpuFp8Experts):
            """The fp8 experts without Gaudi's kernel (emulation's dequantized path)."""

            def _kernel(self) -> None:
                return None

        method, cpu_method = HpuFp8Experts(), CpuFp8Experts()
        for m in (method, cpu_method):
            m.block, m.input_mode = None, mode
        on_cpu = functools.partial(cpu_method.run_experts, _fp8_layer("cpu"))
        on_device = functools.partial(method.run_experts, _fp8_layer("hpu"))
        inputs = (torch.randn(6, 64), *_routing())
        return _both(on_device, on_cpu, inputs, 2e-2)  # the kernel returns bf16

    return check


def _fp8_matmul() -> Outcome:
    from vllm_hpu.quantization.dequant import scaled_matmul
    from vllm_hpu.quantization.fp8 import FP8_DTYPE, fp8_scaled_mm

    a = torch.randn(6, 64).clamp(-8, 8).to(FP8_DTYPE)
    b = torch.randn(32, 64).clamp(-8, 8).to(FP8_DTYPE).t()
    scales = (torch.rand(6, 1) + 0.5, torch.rand(32, 1) + 0.5)  # vLLM's [N, 1]
    return _both(
        functools.partial(fp8_scaled_mm, out_dtype=torch.bfloat16),
        functools.partial(scaled_matmul, out_dtype=torch.float32),
        (a, b, *scales),
        1e-2,
    )


def _graph_replay() -> Outcome:
    linear = torch.nn.Linear(16, 16)
    graphed = device.wrap_in_graph(copy.deepcopy(linear).to("hpu"))

    def replay(x: torch.Tensor) -> torch.Tensor:
        return graphed(True, input=x)

    replay(torch.randn(4, 16).to("hpu"))  # captured
    return _both(replay, linear, (torch.randn(4, 16),), 1e-5)  # replayed


def kernel_checks() -> dict[str, tuple[str, Check]]:
    """Each kernel the plugin calls on Gaudi: (what it calls, its check)."""
    from vllm_hpu.quantization.fp8_moe import PER_TENSOR, STATIC

    checks: dict[str, tuple[str, Check]] = {
        "RMSNorm": ("hpex FusedRMSNorm", _rms_norm),
        "rotary (halves)": ("hpex apply_rotary_pos_emb BLOCKWISE", _rotary(True)),
        "rotary (pairs)": ("hpex apply_rotary_pos_emb PAIRWISE", _rotary(False)),
        "prompt attention": ("hpex FusedSDPA", _fused_sdpa),
        "attention tiles": ("hpu::sdpa_recomp_fwd", _sdpa_stats),
        "experts": ("hpu::mixture_of_experts.fused_weights", _experts),
        "fp8 experts (static)": (
            "hpu::mixture_of_experts.fp8_fused_weights",
            _fp8_experts(STATIC),
        ),
        "fp8 experts (dynamic)": (
            "hpu::mixture_of_experts.fp8_fused_weights_dynamic",
            _fp8_experts(PER_TENSOR),
        ),
        "fp8 matmul": ("hpu::fp8_gemm_v2, per token x per channel", _fp8_matmul),
    }
    if device.is_lazy():
        checks["HPU graphs"] = ("wrap_in_hpu_graph, a replay", _graph_replay)
    return checks


def kernel_row(name: str, kernel: str, check: Check) -> Row:
    """The device's result against the CPU's: the largest difference relative
    to the largest CPU value, within the check's tolerance."""
    torch.manual_seed(0)
    try:
        on_device, on_cpu, tolerance = check()
        device.mark_step()
        got, want = on_device.detach().float().cpu(), on_cpu.detach().float()
        error = float((got - want).abs().max() / want.abs().max().clamp(min=1e-6))
    except Exception as failure:  # a refused call is this line's verdict
        first_line = (str(failure).strip().splitlines() or [""])[0]
        detail = f"{kernel}: {type(failure).__name__}: {first_line}"
        return Row(name, FAIL, detail[:200], REPORT)
    detail = f"{kernel}: relative error {error:.1e}"
    if not error <= tolerance:
        return Row(name, FAIL, f"{detail} > {tolerance:g}", REPORT)
    return Row(name, OK, detail)


# ---- the table ---------------------------------------------------------------


def run_checks() -> list[Row]:
    if not device.hpu_available():
        return [
            Row(
                "Gaudi",
                FAIL,
                "the Habana bridge (habana-torch-plugin) does not import or "
                "reports no card",
                "run on a Gaudi host or container as README_GAUDI.md installs it "
                "(hl-smi lists the cards); without one, VLLM_HPU_EMULATION=1 runs "
                "the plugin on the CPU, which needs no self-check",
            )
        ]
    from vllm.config import VllmConfig, set_current_vllm_config

    rows = [*version_rows(), *environment_rows()]
    with torch.no_grad(), set_current_vllm_config(VllmConfig()):
        rows += [kernel_row(n, k, c) for n, (k, c) in kernel_checks().items()]
    return rows


def format_table(rows: list[Row]) -> str:
    name = max(len(r.check) for r in rows)
    verdict = max(len(r.verdict) for r in rows)
    indent = " " * (name + verdict + 4)
    lines = []
    for row in rows:
        lines.append(f"{row.check:<{name}}  {row.verdict:<{verdict}}  {row.detail}")
        if row.fix:
            lines.append(f"{indent}fix: {row.fix}")
    return "\n".join(lines)


def main() -> int:
    rows = run_checks()
    print(format_table(rows))
    return 1 if any(row.verdict == FAIL for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
