"""The seeded benchmark workload, in a JSON file so every system runs the same requests.

Prompt lengths are log-normal (median PROMPT_MEDIAN tokens, sigma PROMPT_SIGMA),
clipped to PROMPT_MIN..PROMPT_MAX; output lengths are uniform in OUTPUT_MIN..OUTPUT_MAX
(a spec may change the median and the bounds) and exact (every system ignores
EOS). Prompt tokens are drawn from the tokenizer's ordinary vocabulary, never its
special tokens.
"""

import argparse
import dataclasses
import json
import math
import random
from pathlib import Path

PROMPT_MEDIAN, PROMPT_SIGMA = 200, 0.8  # mu = ln(200): half the prompts below 200
PROMPT_MIN, PROMPT_MAX = 16, 1024
OUTPUT_MIN, OUTPUT_MAX = 16, 256
QUICK_OUTPUT_MAX = 32


@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    num_requests: int = 64
    seed: int = 0
    output_max: int = OUTPUT_MAX
    # Other shapes (benchmarks/graphs.py's long-prompt trace) change these.
    output_min: int = OUTPUT_MIN
    prompt_median: int = PROMPT_MEDIAN
    prompt_max: int = PROMPT_MAX


@dataclasses.dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int


def prompt_length(
    rng: random.Random, median: int = PROMPT_MEDIAN, longest: int = PROMPT_MAX
) -> int:
    """One log-normal prompt length, clipped to PROMPT_MIN..longest."""
    length = round(rng.lognormvariate(math.log(median), PROMPT_SIGMA))
    return min(max(length, PROMPT_MIN), longest)


def text_token_ids(special_ids: set[int], vocab_size: int) -> list[int]:
    """Token ids a prompt may use: the whole vocabulary minus special tokens."""
    return [i for i in range(vocab_size) if i not in special_ids]


def make_workload(spec: WorkloadSpec, token_ids: list[int]) -> list[BenchRequest]:
    rng = random.Random(spec.seed)
    requests = []
    for _ in range(spec.num_requests):
        prompt_len = prompt_length(rng, spec.prompt_median, spec.prompt_max)
        output_len = rng.randint(spec.output_min, spec.output_max)
        prompt = rng.choices(token_ids, k=prompt_len)
        requests.append(BenchRequest(prompt, output_len))
    return requests


def tokenizer_token_ids(model_dir: str) -> list[int]:
    """SmolLM2's ordinary tokens, read from its tokenizer (no special tokens)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    special = set(tokenizer.all_special_ids)
    special.update(tokenizer.added_tokens_decoder)
    return text_token_ids(special, len(tokenizer))


def save_workload(requests: list[BenchRequest], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([dataclasses.asdict(r) for r in requests]))


def load_workload(path: Path) -> list[BenchRequest]:
    return [BenchRequest(**item) for item in json.loads(path.read_text())]


def describe(requests: list[BenchRequest]) -> str:
    prompts = sorted(len(r.prompt_token_ids) for r in requests)
    outputs = [r.output_len for r in requests]
    return (
        f"{len(requests)} requests; prompt tokens median {prompts[len(prompts) // 2]} "
        f"(min {prompts[0]}, max {prompts[-1]}, total {sum(prompts)}); output tokens "
        f"mean {sum(outputs) / len(outputs):.0f} (total {sum(outputs)})"
    )


def child_parser(description: str | None) -> argparse.ArgumentParser:
    """The arguments benchmarks/run.py gives every system's child process."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--system", required=True)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", required=True)
    parser.add_argument("--threads", type=int, required=True)
    return parser
