"""Intel Neural Compressor's FP8 flow end to end in emulation: calibrate with
``python -m vllm_hpu.calibrate`` over a local prompt file, then serve the QUANTIZE
config with an fp8_inc KV cache; greedy tokens close to the bf16 model's, the
relative error of each decoder layer's output and of the logits reported.

Greedy agreement is taken with the bf16 tokens as context (teacher forcing):
free-running, one flipped near-tie changes every later token of its prompt,
which measures the prompt set more than the quantization (printed too)."""

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from models import model_path as model_dir

from e2e.harness import default_engine, vllm_engine, vllm_greedy

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"  # real weights: its greedy choices are decisive
DATASET = Path(__file__).resolve().parent.parent / "data" / "inc_calibration.jsonl"
ENGINE = {
    "dtype": "bfloat16",
    "max_model_len": 128,
    "max_num_batched_tokens": 128,
    "block_size": 16,
}
MAX_TOKENS = 12
MIN_AGREEMENT = 0.9
MAX_LOGITS_ERROR = 0.2
# Below this the logits are bf16's: nothing was quantized (0.15 measured).
MIN_LOGITS_ERROR = 0.01
# The linear layers INC replaces in every decoder layer (lm_head is blocklisted).
LINEARS = (
    "self_attn.qkv_proj",
    "self_attn.o_proj",
    "mlp.gate_up_proj",
    "mlp.down_proj",
)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory) -> Path:
    from vllm_hpu import calibrate

    output = tmp_path_factory.mktemp("inc")
    calibrate.main(
        [
            str(model_dir(MODEL)),
            f"--dataset={DATASET}",
            f"--output={output}",
            "--max-tokens=4",
            "--max-model-len=128",
            "--max-num-batched-tokens=128",
            # A 135M model's LM head in fp8 flips near-ties: 88% of tokens agreed
            # with it quantized, 94% without (docs/fp8.md).
            "--blocklist=lm_head",
        ]
    )
    return output


def _prompt_ids() -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir(MODEL))
    lines = DATASET.read_text().splitlines()
    texts = [
        r if isinstance(r, str) else r.get("prompt") or r["text"]
        for r in map(json.loads, lines)
    ]
    return [tokenizer(text)["input_ids"] for text in texts]


def _capture(model: torch.nn.Module, store: list[torch.Tensor]) -> None:
    """Each decoder layer's output (hidden + residual) and the logits, in order."""

    def keep(_module, _inputs, output) -> None:  # type: ignore[no-untyped-def]
        if isinstance(output, tuple):
            output = output[0] + output[1]
        store.append(output.detach().float().clone())

    for layer in model.model.layers:
        layer.register_forward_hook(keep)
    model.logits_processor.register_forward_hook(keep)


def _first_pass(
    llm, prompts: list[list[int]], model: str = MODEL
) -> tuple[list, list[torch.Tensor]]:
    """Greedy tokens, and the layer outputs and logits of the first prompt pass."""
    store: list[torch.Tensor] = []
    llm.apply_model(lambda module: _capture(module, store))
    tokens = vllm_greedy(llm, prompts, MAX_TOKENS)
    return tokens, store[: _num_layers(model) + 1]


def _num_layers(model: str = MODEL) -> int:
    return int(_config(model)["num_hidden_layers"])


def _config(model: str) -> dict:
    return json.loads((Path(model_dir(model)) / "config.json").read_text())


@pytest.fixture(scope="module")
def bf16_run() -> Iterator[tuple[list, list[torch.Tensor]]]:
    with vllm_engine(model_dir(MODEL), **ENGINE) as llm:
        yield _first_pass(llm, _prompt_ids())


def test_measurements_name_every_linear_and_attention_step(calibrated):
    files = {p.name for p in calibrated.iterdir()}
    assert files >= {
        "inc_output_hooks_maxabs_0_1.json",
        "inc_output_hooks_maxabs_0_1.npz",
        "inc_output_hooks_maxabs_0_1_mod_list.json",
        "maxabs_measure.json",
        "maxabs_quant.json",
    }
    nodes = json.loads((calibrated / "inc_output_hooks_maxabs_0_1.json").read_text())
    measured = set(nodes["Nodes"])
    per_layer = [
        "self_attn.qkv_proj",
        "self_attn.o_proj",
        "mlp.gate_up_proj",
        "mlp.down_proj",
    ] + [
        f"self_attn.attn.impl.{name}"
        for name in (
            "matmul_qk",
            "matmul_av",
            "k_cache",
            "v_cache",
            "fused_scaled_dot_product_attention",
        )
    ]
    expected = {"lm_head"} | {
        f"model.layers.{i}.{name}" for i in range(_num_layers()) for name in per_layer
    }
    assert expected <= measured, sorted(expected - measured)


def _linear_kinds(model: torch.nn.Module) -> dict[str, tuple[str, torch.dtype]]:
    """Each decoder linear's class (with its module) and its weight's dtype."""
    kinds = {}
    for name, module in model.model.layers.named_modules():
        if name.split(".", 1)[-1] in LINEARS:
            kind = f"{type(module).__module__}.{type(module).__name__}"
            kinds[name] = (kind, module.weight.dtype)
    return kinds


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


def _teacher_forced_agreement(
    llm, prompts: list[list[int]], continuations: list[list[int]]
) -> float:
    """The share of continuation tokens that are also this engine's greedy
    choice, given the prompt and the continuation so far."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=1)
    inputs = [
        {"prompt_token_ids": p + c} for p, c in zip(prompts, continuations, strict=True)
    ]
    agree = total = 0
    for result, prompt, cont in zip(
        llm.generate(inputs, params), prompts, continuations, strict=True
    ):
        ranked = result.prompt_logprobs[len(prompt) :]
        for token, logprobs in zip(cont, ranked, strict=True):
            agree += logprobs[token].rank == 1
            total += 1
    return agree / total


def test_fp8_serving_agrees_with_bf16(calibrated, bf16_run, hpu_env):
    hpu_env(QUANT_CONFIG=str(calibrated / "maxabs_quant.json"))
    prompts = _prompt_ids()
    want_tokens, want_store = bf16_run
    with vllm_engine(
        model_dir(MODEL), quantization="inc", kv_cache_dtype="fp8_inc", **ENGINE
    ) as llm:
        tokens, store = _first_pass(llm, prompts)
        agreement = _teacher_forced_agreement(llm, prompts, want_tokens)
        (kinds,) = llm.apply_model(_linear_kinds)
    # INC's patched modules replaced every linear, their weights fp8 in memory.
    assert len(kinds) == len(LINEARS) * _num_layers()
    for name, (kind, dtype) in kinds.items():
        assert kind.startswith("neural_compressor.") and ".Patched" in kind, name
        assert dtype == torch.float8_e4m3fn, name
    flat = [t for s in tokens for t in s]
    want = [t for s in want_tokens for t in s]
    free_running = sum(a == b for a, b in zip(flat, want, strict=True)) / len(want)
    errors = [_relative_error(g, w) for g, w in zip(store, want_store, strict=True)]
    report = ", ".join(f"{e:.3f}" for e in errors)
    print(
        f"INC fp8 vs bf16 greedy tokens: {agreement:.0%} agree given bf16 context, "
        f"{free_running:.0%} free-running; relative error per decoder layer, then "
        f"of the logits (first pass): {report}"
    )
    assert agreement >= MIN_AGREEMENT
    assert MIN_LOGITS_ERROR < errors[-1] < MAX_LOGITS_ERROR


def test_unit_scale_runs_without_calibration(tmp_path, bf16_run, hpu_env):
    config = {
        "mode": "QUANTIZE",
        "scale_method": "unit_scale",
        "dump_stats_path": str(tmp_path / "none"),
    }
    (tmp_path / "unit_scale.json").write_text(json.dumps(config))
    hpu_env(QUANT_CONFIG=str(tmp_path / "unit_scale.json"))
    # vLLM's default engine (its core in a process of its own) reads it too.
    with default_engine(model_dir(MODEL), kv_cache_dtype="fp8_inc", **ENGINE) as llm:
        tokens = vllm_greedy(llm, _prompt_ids()[:1], 4)
    assert len(tokens[0]) == 4 and not list(tmp_path.glob("none*"))


# -- Mixture of experts: INC's own MoE modules measure and quantize each expert.
# SmolLM2's MLPs upcycled into 4 experts, top 2 (tests/moe_checkpoints.py): a
# MoE whose greedy choices are as decisive as the dense test's, held to its
# bounds (a random tiny Mixtral's near-ties flipped under any rounding: 85 %).
NUM_EXPERTS = 4


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory) -> Path:
    from moe_checkpoints import write_upcycled_moe

    out = tmp_path_factory.mktemp("upcycled") / "smollm2-moe"
    return write_upcycled_moe(Path(model_dir(MODEL)), out, NUM_EXPERTS)


def _inc_json(path: Path, mode: str, dump: Path) -> str:
    path.write_text(json.dumps({"mode": mode, "dump_stats_path": str(dump)}))
    return str(path)


@pytest.fixture(scope="module")
def moe_measured(
    tmp_path_factory, moe_model
) -> tuple[Path, list, list[torch.Tensor], list]:
    """The MEASURE pass over the prompts (its outputs are bf16's): the folder of
    its files, its greedy tokens, layer outputs and logits, and the files found
    before the engine shut down (none: no explicit shutdown_inc, the worker's
    shutdown writes them)."""
    from vllm_hpu import envs

    folder = tmp_path_factory.mktemp("inc_moe")
    config = _inc_json(folder / "measure.json", "MEASURE", folder / "moe")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("QUANT_CONFIG", config)
        envs.get_envs.cache_clear()
        with vllm_engine(str(moe_model), **ENGINE) as llm:
            tokens, store = _first_pass(llm, _prompt_ids())
            written_while_running = list(folder.glob("moe_hooks_maxabs*"))
    envs.get_envs.cache_clear()
    return folder, tokens, store, written_while_running


def test_moe_measurements_name_every_expert(moe_measured):
    folder, _, _, written_while_running = moe_measured
    assert not written_while_running  # the engine's shutdown writes them
    nodes = json.loads((folder / "moe_hooks_maxabs_0_1.json").read_text())["Nodes"]
    experts = [
        f"model.layers.{i}.block_sparse_moe.experts.routed_experts.moe_op{name}"
        for i in range(_num_layers())
        for name in [""]
        + [f".{p}_list.{e}" for p in ("w13", "w2") for e in range(NUM_EXPERTS)]
    ]
    assert set(experts) <= set(nodes), sorted(set(experts) - set(nodes))


def _expert_state(model: torch.nn.Module) -> list[tuple[str, ...]]:
    """Each MoE layer's op class, its experts' classes and weight dtypes, and
    the size of the layer's own stacked weights."""
    from vllm.model_executor.layers.fused_moe import RoutedExperts

    state = []
    for layer in model.modules():
        if isinstance(layer, RoutedExperts):
            experts = [*layer.moe_op.w13_list, *layer.moe_op.w2_list]
            state.append(
                (
                    type(layer.moe_op).__name__,
                    *{type(expert).__name__ for expert in experts},
                    *{str(expert.weight.dtype) for expert in experts},
                    str(layer.w13_weight.numel() + layer.w2_weight.numel()),
                )
            )
    return state


def test_moe_fp8_serving_quantizes_the_experts(
    moe_model, moe_measured, hpu_env, vllm_log
):
    """Only the experts in fp8 (the rest as the dense test checks it), held
    to the dense test's bounds: the same agreement given bf16 context, the
    logits moved, but by less than its bound."""
    folder, want_tokens, want_store, _ = moe_measured
    config = folder / "quant.json"
    _inc_json(config, "QUANTIZE", folder / "moe")
    only_experts = {
        "allowlist": {"types": ["VllmMixtureOfExpertsOp", "MoeMatmul"]},
        "blocklist": {"types": ["VLLMKVCache"]},
    }
    config.write_text(json.dumps({**json.loads(config.read_text()), **only_experts}))
    hpu_env(QUANT_CONFIG=str(config))
    prompts = _prompt_ids()
    with vllm_engine(str(moe_model), quantization="inc", **ENGINE) as llm:
        experts = llm.apply_model(_expert_state)[0]
        _, store = _first_pass(llm, prompts)
        agreement = _teacher_forced_agreement(llm, prompts, want_tokens)
    fp8 = ("PatchedVllmMixtureOfExpertsOp", "PatchedMoeMatmul", "torch.float8_e4m3fn")
    assert experts == [(*fp8, "0")] * _num_layers()
    (warning,) = [m for m in vllm_log.messages(logging.WARNING) if "stay in bf16" in m]
    layers = _num_layers()
    assert f"model.layers.*.block_sparse_moe.gate (GateLinear) x{layers}" in warning
    errors = [_relative_error(g, w) for g, w in zip(store, want_store, strict=True)]
    print(
        f"INC fp8 experts of upcycled SmolLM2 vs bf16: {agreement:.0%} of greedy "
        "tokens agree given bf16 context; relative error per layer, then logits: "
        + ", ".join(f"{e:.3f}" for e in errors)
    )
    assert agreement >= MIN_AGREEMENT
    assert MIN_LOGITS_ERROR < errors[-1] < MAX_LOGITS_ERROR
