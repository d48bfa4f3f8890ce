"""Write a layer-truncated SmolLM2 as a draft model for speculative decoding.

Usage: smollm2_draft.py OUT_DIR [--num-layers N] [--name NAME]. Reads
OUT_DIR/smollm2-135m-instruct (``convert_smollm2.py``) and writes
OUT_DIR/smollm2-135m-instruct-draft: its first N decoder layers with its
embeddings, final norm and (tied) LM head, and its tokenizer. A
self-speculative draft: the shared layers are the target's own, so on text
the first layers already predict, its greedy tokens agree with the target's;
it costs the target's embedding and LM head plus N of its 30 layers.
"""

import argparse
import json
import shutil
import time
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

TARGET_NAME = "smollm2-135m-instruct"
DRAFT_NAME = f"{TARGET_NAME}-draft"
# Chosen on benchmarks/spec_decode.py's prompts: acceptance against cost.
DEFAULT_LAYERS = 4
STAMP_FILE = ".build_version"
FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def log(message: str) -> None:
    print(f"[smollm2-draft] {message}", flush=True)


def kept(name: str, num_layers: int) -> bool:
    """Whether a checkpoint tensor belongs to the draft."""
    if not name.startswith("model.layers."):
        return True
    return int(name.split(".")[2]) < num_layers


def truncate(target: Path, out_dir: Path, num_layers: int) -> None:
    config = json.loads((target / "config.json").read_text())
    if not 0 < num_layers < config["num_hidden_layers"]:
        raise ValueError(
            f"--num-layers {num_layers}: the draft keeps between 1 and "
            f"{config['num_hidden_layers'] - 1} of the target's layers"
        )
    config["num_hidden_layers"] = num_layers
    out_dir.mkdir(parents=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    with safe_open(str(target / "model.safetensors"), "pt") as weights:
        tensors = {
            name: weights.get_tensor(name)
            for name in weights.keys()  # noqa: SIM118 (a safe_open handle)
            if kept(name, num_layers)
        }
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    for name in FILES:
        shutil.copy(target / name, out_dir / name)


def build_version(target: Path, num_layers: int) -> str:
    """The target's stamp and the layer count: a new target, a new draft."""
    return f"{(target / STAMP_FILE).read_text().strip()} layers {num_layers}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out_root", type=Path)
    parser.add_argument("--num-layers", type=int, default=DEFAULT_LAYERS)
    parser.add_argument("--name", default=DRAFT_NAME)
    args = parser.parse_args()
    target = args.out_root / TARGET_NAME
    if not (target / STAMP_FILE).is_file():
        raise SystemExit(f"{target} is missing: run scripts/convert_smollm2.py first")
    final = args.out_root / args.name
    version = build_version(target, args.num_layers)
    stamp = final / STAMP_FILE
    if stamp.is_file() and stamp.read_text().strip() == version:
        log(f"{final} is up to date")
        return
    started = time.perf_counter()
    # Written into a scratch folder and swapped in: an interrupted run never
    # leaves a folder that looks complete.
    scratch = args.out_root / f".{args.name}.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    truncate(target, scratch, args.num_layers)
    (scratch / STAMP_FILE).write_text(version + "\n")
    shutil.rmtree(final, ignore_errors=True)
    scratch.rename(final)
    log(f"wrote {final} in {time.perf_counter() - started:.1f}s")


if __name__ == "__main__":
    main()
