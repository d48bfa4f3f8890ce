"""Build a draft model for SmolLM2-135M-Instruct by distillation.

Usage: build_draft_model.py [OUT_DIR] (default .cache/models). Writes
OUT_DIR/smollm2-draft-192x2 once (a stamp file marks it complete).

No smaller model sharing SmolLM2's tokenizer is available offline, so this
builds one as draft models are built: a two-layer Llama of hidden size 192
with SmolLM2's vocabulary and tokenizer (about a tenth of the target's work
per token, most of it the tied LM head), trained to predict the target's
greedy token at every position of the target's own continuations of generic
prompts (scripts/draft_prompts.py: none is the benchmark's).

1. The target continues every prompt greedily and once sampled
   (CONTINUATION_TOKENS each); its argmax at every position of prompt and
   continuation is the label.
2. The draft's tied embedding starts as the target's projected on its
   leading HIDDEN_SIZE singular directions (so that its LM head starts close
   to the target's on states in that span); its layers start random.
3. TRAIN_STEPS of AdamW on cross-entropy against the labels; the held-out
   tenth of the sequences gives the top-1 agreement printed at the end.

The draft's attention has the target's KV heads and head size (3 x 64), so
both models' layers share one KV cache page size. Deterministic: fixed
seeds, fixed thread count; a few minutes on two CPU cores.
"""

import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
from draft_prompts import draft_prompts

from vllm_hpu.patches.torchvision_import import allow_torchvision_import

# transformers imports torchvision once it is installed (see that patch).
allow_torchvision_import()
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
)
from transformers.utils import logging as hf_logging  # noqa: E402

TARGET_NAME = "smollm2-135m-instruct"
# Bump whenever anything below changes what gets written.
BUILD_VERSION = "1"
STAMP_FILE = ".build_version"
# The target's tokenizer and generation defaults, copied beside the weights.
COPIED_FILES = [
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
]
SEED = 0
# One thread: on a shared machine two threads wait for each other.
NUM_THREADS = 1
# A few minutes of CPU: let the machine's other work go first.
NICENESS = 10

HIDDEN_SIZE = 192
INTERMEDIATE_SIZE = 768
NUM_LAYERS = 2
# The target's KV heads and head size: vLLM gives both models' layers one KV
# cache spec. (transformers wants the hidden size a multiple of the heads.)
NUM_KV_HEADS = 3
HEAD_DIM = 64
NUM_HEADS = HIDDEN_SIZE // HEAD_DIM
DRAFT_NAME = f"smollm2-draft-{HIDDEN_SIZE}x{NUM_LAYERS}"

CONTINUATION_TOKENS = 32
SAMPLING_TEMPERATURE = 0.8
GENERATE_BATCH = 64
TRAIN_BATCH = 16
TRAIN_STEPS = 300
NUM_NEGATIVES = 2048
LEARNING_RATE = 3e-3
WARMUP_STEPS = 20
HELD_OUT_EVERY = 10  # every tenth sequence is held out
IGNORE = -100


def log(message: str) -> None:
    print(f"[draft] {message}", flush=True)


def continuations(target, tokenizer, prompts: list[str], sample: bool):
    """Prompt plus continuation token ids, per prompt (EOS ends one early)."""
    sequences = []
    tokenizer.padding_side = "left"
    for begin in range(0, len(prompts), GENERATE_BATCH):
        batch = tokenizer(
            prompts[begin : begin + GENERATE_BATCH], return_tensors="pt", padding=True
        )
        with torch.no_grad():
            output = target.generate(
                **batch,
                max_new_tokens=CONTINUATION_TOKENS,
                do_sample=sample,
                temperature=SAMPLING_TEMPERATURE if sample else None,
                top_k=None,
                top_p=None,
                pad_token_id=tokenizer.pad_token_id,
            )
        width = batch["input_ids"].shape[1]
        for mask, row in zip(batch["attention_mask"], output, strict=True):
            prompt = row[:width][mask.bool()].tolist()
            generated = row[width:].tolist()
            if tokenizer.eos_token_id in generated:
                generated = generated[: generated.index(tokenizer.eos_token_id) + 1]
            sequences.append(prompt + generated)
        log(f"{len(sequences)} of {len(prompts)} continuations")
    return sequences


def pad(sequences: list[list[int]], value: int) -> torch.Tensor:
    """Right-padded [len(sequences), longest] tensor."""
    width = max(len(s) for s in sequences)
    return torch.tensor([s + [value] * (width - len(s)) for s in sequences])


def target_labels(target, sequences: list[list[int]]) -> torch.Tensor:
    """The target's argmax after every position; IGNORE past each sequence
    (right padding leaves the real positions' causal attention unchanged)."""
    labels = []
    for begin in range(0, len(sequences), GENERATE_BATCH):
        chunk = sequences[begin : begin + GENERATE_BATCH]
        with torch.no_grad():
            logits = target(input_ids=pad(chunk, 0)).logits
        argmax = logits.argmax(dim=-1)
        for row, sequence in zip(argmax, chunk, strict=True):
            row[len(sequence) :] = IGNORE
            labels.append(row)
    width = max(len(s) for s in sequences)
    return torch.stack(
        [torch.nn.functional.pad(r, (0, width - len(r)), value=IGNORE) for r in labels]
    )


def draft_config(target_config) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=target_config.vocab_size,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=target_config.max_position_embeddings,
        rope_parameters=target_config.rope_parameters,
        rms_norm_eps=target_config.rms_norm_eps,
        tie_word_embeddings=True,
        bos_token_id=target_config.bos_token_id,
        eos_token_id=target_config.eos_token_id,
        pad_token_id=target_config.pad_token_id,
    )


def initial_draft(target) -> LlamaForCausalLM:
    """Random layers; the embedding (and tied LM head) the target's projected
    on its leading singular directions, rescaled to the target's norm."""
    draft = LlamaForCausalLM(draft_config(target.config))
    embedding = target.get_input_embeddings().weight.detach().float()
    _, _, vh = torch.linalg.svd(embedding, full_matrices=False)
    projected = embedding @ vh[:HIDDEN_SIZE].T
    projected *= embedding.norm() / projected.norm()
    draft.get_input_embeddings().weight.data.copy_(projected)
    return draft


def sampled_loss(
    draft, inputs: torch.Tensor, labels: torch.Tensor, generator
) -> torch.Tensor:
    """Cross-entropy over the batch's labels and NUM_NEGATIVES random other
    tokens instead of the whole vocabulary (the full LM head would cost most
    of a step): the labels must beat every token sampled against them."""
    hidden = draft.model(input_ids=inputs).last_hidden_state
    real = labels != IGNORE
    negatives = torch.randint(
        draft.config.vocab_size, (NUM_NEGATIVES,), generator=generator
    )
    candidates = torch.cat([labels[real], negatives]).unique()
    logits = hidden[real] @ draft.lm_head.weight[candidates].T
    targets = torch.searchsorted(candidates, labels[real])
    return torch.nn.functional.cross_entropy(logits, targets)


def learning_rate(step: int) -> float:
    """Linear warmup, then cosine decay to zero at TRAIN_STEPS."""
    warmup = min(1.0, (step + 1) / WARMUP_STEPS)
    return LEARNING_RATE * warmup * 0.5 * (1 + math.cos(math.pi * step / TRAIN_STEPS))


def train(draft, inputs: torch.Tensor, labels: torch.Tensor) -> None:
    """TRAIN_STEPS of AdamW, each on TRAIN_BATCH random sequences."""
    optimizer = torch.optim.AdamW(
        draft.parameters(), lr=LEARNING_RATE, weight_decay=0.0
    )
    generator = torch.Generator().manual_seed(SEED)
    draft.train()
    for step in range(TRAIN_STEPS):
        index = torch.randperm(len(inputs), generator=generator)[:TRAIN_BATCH]
        loss = sampled_loss(draft, inputs[index], labels[index], generator)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optimizer.step()
        if step % 50 == 0 or step == TRAIN_STEPS - 1:
            log(f"step {step} loss {loss.item():.3f}")
    draft.eval()


def agreement(draft, inputs: torch.Tensor, labels: torch.Tensor) -> float:
    """Share of positions where the draft's argmax is the target's."""
    with torch.no_grad():
        predicted = draft(input_ids=inputs).logits.argmax(dim=-1)
    real = labels != IGNORE
    return (predicted[real] == labels[real]).float().mean().item()


def labelled_sequences(target_dir: Path) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """(input ids, the target's labels, the target): every prompt continued
    greedily and once sampled."""
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    target.eval()
    prompts = draft_prompts()
    sequences = continuations(target, tokenizer, prompts, sample=False)
    sequences += continuations(target, tokenizer, prompts, sample=True)
    labels = target_labels(target, sequences)
    log(f"{len(sequences)} sequences, {int((labels != IGNORE).sum())} labels")
    return pad(sequences, tokenizer.pad_token_id), labels, target


def build(out_dir: Path) -> Path:
    target_dir = out_dir / TARGET_NAME
    path = out_dir / DRAFT_NAME
    stamp = path / STAMP_FILE
    if stamp.exists() and stamp.read_text() == BUILD_VERSION:
        return path
    os.nice(NICENESS)
    torch.manual_seed(SEED)
    torch.set_num_threads(NUM_THREADS)
    hf_logging.set_verbosity_error()
    started = time.perf_counter()
    inputs, labels, target = labelled_sequences(target_dir)
    held_out = torch.arange(len(inputs)) % HELD_OUT_EVERY == 0
    draft = initial_draft(target)
    del target
    train(draft, inputs[~held_out], labels[~held_out])
    score = agreement(draft, inputs[held_out], labels[held_out])
    log(f"held-out top-1 agreement with the target: {score:.3f}")
    if path.exists():
        shutil.rmtree(path)
    draft.save_pretrained(path)
    for name in COPIED_FILES:
        shutil.copy(target_dir / name, path / name)
    stamp.write_text(BUILD_VERSION)
    log(f"wrote {path} in {time.perf_counter() - started:.0f} s")
    return path


if __name__ == "__main__":
    build(Path(sys.argv[1] if len(sys.argv) > 1 else ".cache/models"))
