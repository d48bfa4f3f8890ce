"""Device memory of quantized checkpoints against their bf16 model, read from
the device meter (the emulated HPU counts the process's resident memory).

A random bf16 Qwen3-MoE whose experts hold almost all its weights is written with
its experts in block fp8 (DeepSeek's layout) and in 4-bit AWQ by the tests'
writers (tests/moe_checkpoints.py). With --dense, a random bf16 Llama whose linear
layers hold almost all its weights is written in block fp8 by the tests' writer
(tests/quant_checkpoints.py) and in W4A16 (group 128) and MXFP4-A16 by
llm-compressor (scripts/build_quant_checkpoints.py runs it apart from the venv).
Each model loads in a fresh child process (in one process the meter also sees the
engines before), and the meter's reading for the weights is printed against the
bf16 model's weight bytes. Targets: fp8 at most 55 %, 4 bits at most 30 %.
Run: PYTHONPATH=$PWD VLLM_HPU_EMULATION=1 python benchmarks/moe_memory.py [--dense]
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
TESTS, SCRIPTS = REPO / "tests", REPO / "scripts"
QUANT_TOOLS = REPO / ".cache" / "quant-tools"  # the Makefile's TOOLS_DIR
METER_LINE = re.compile(r"Loading model weights took .* and ([0-9.]+) GiB of device")
FOUR_BITS = ("awq-g128", "w4a16-g128", "mxfp4a16")
TARGETS = {"fp8-block": 0.55, **dict.fromkeys(FOUR_BITS, 0.30)}


def build_wide_moe(path: Path, num_experts: int, intermediate: int) -> int:
    """The bf16 model; returns its parameter count."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=256,
        hidden_size=512,
        moe_intermediate_size=intermediate,
        num_experts=num_experts,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=128,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def build_wide_llama(path: Path, layers: int, intermediate: int) -> int:
    """The bf16 dense model; returns its parameter count."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=1024,
        hidden_size=2048,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=16,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    unquantized = model.get_input_embeddings().weight.numel() * 2  # with lm_head
    total = sum(p.numel() for p in model.parameters())
    print(f"embedding and lm_head (unquantized): {unquantized / total:.1%} of them")
    return total


def write_dense_quantized(bf16: Path, out: Path) -> dict[str, Path]:
    sys.path[:0] = [str(TESTS), str(SCRIPTS)]
    from build_quant_checkpoints import run_writer
    from quant_checkpoints import Fp8Scheme, write_checkpoints

    models = {"fp8-block": write_checkpoints(bf16, out / "fp8-block", Fp8Scheme())[0]}
    for name in ("w4a16-g128", "mxfp4a16"):  # llm-compressor's SCHEMES names
        run_writer(QUANT_TOOLS, str(bf16), str(out / name), name)
        models[name] = out / name
    return models


def write_quantized(bf16: Path, out: Path) -> dict[str, Path]:
    sys.path.insert(0, str(TESTS))  # the tests' checkpoint writers
    from moe_checkpoints import Fp8Experts, write_moe_checkpoints
    from quant_checkpoints import Scheme

    schemes = {"fp8-block": Fp8Experts(), "awq-g128": Scheme("awq", group_size=128)}
    return {
        name: write_moe_checkpoints(bf16, out / name, scheme)[0]
        for name, scheme in schemes.items()
    }


def meter_reading(model: Path) -> int:
    """Bytes the device meter counted while a fresh process loaded ``model``."""
    child = (
        "from vllm import LLM; import sys; LLM(model=sys.argv[1], dtype='bfloat16', "
        "enforce_eager=True, skip_tokenizer_init=True, max_model_len=128, "
        "max_num_seqs=4, kv_cache_memory_bytes=1 << 24)"
    )
    # The engine stays in the child, whose log has the meter's line.
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    done = subprocess.run(
        [sys.executable, "-c", child, str(model)],
        capture_output=True,
        text=True,
        env=env,
    )
    match = METER_LINE.search(done.stdout + done.stderr)
    if match is None:
        raise SystemExit(f"{model}: no meter reading:\n{done.stderr}")
    return int(float(match.group(1)) * (1 << 30))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dense", action="store_true", help="a Llama, not a MoE")
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--layers", type=int, default=2, help="of the dense model")
    # ~300 MiB in bf16: the meter's ~10 MiB of its own (loader, Python objects)
    # stays small against the weights.
    parser.add_argument("--intermediate", type=int, help="default 3072, dense 8192")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        bf16 = Path(folder) / "bf16"
        if args.dense:
            params = build_wide_llama(bf16, args.layers, args.intermediate or 8192)
            models = write_dense_quantized(bf16, Path(folder))
            shape = f"dense, {args.layers} layers"
        else:
            params = build_wide_moe(bf16, args.experts, args.intermediate or 3072)
            models = write_quantized(bf16, Path(folder))
            shape = f"{args.experts} experts"
        readings = {
            name: meter_reading(path) for name, path in {"bf16": bf16, **models}.items()
        }
    weight_bytes = 2 * params
    print(f"bf16 weights: {weight_bytes / 2**20:.1f} MiB ({shape})")
    for name, held in readings.items():
        ratio, target = held / weight_bytes, TARGETS.get(name)
        verdict = ""
        if target is not None:
            met = "met" if ratio <= target else "MISSED"
            verdict = f" (target <= {target:.0%}: {met})"
        print(f"{name:10s} meter {held / 2**20:7.1f} MiB = {ratio:6.1%}{verdict}")


if __name__ == "__main__":
    main()
