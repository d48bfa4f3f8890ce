"""The baseline a user would otherwise run: transformers `generate`, static batches.

Requests are taken in workload order in batches of BATCH_SIZE, left-padded, and
each batch runs to its longest output (EOS suppressed). Only each request's own
output length counts as useful tokens; the rest of its row is computed waste.
Token times come from a logits processor, called once per generation step.
"""

import argparse
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

from benchmarks.results_schema import SystemResult, latency_summary, token_latencies
from benchmarks.workload import BenchRequest, child_parser, load_workload

BATCH_SIZE = 16
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class StepClock(LogitsProcessor):
    """Records when each generation step's logits are ready (its token follows)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor
    ) -> torch.FloatTensor:
        self.times.append(time.perf_counter())
        return scores


def left_padded(
    batch: list[BenchRequest], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both [len(batch), longest prompt]."""
    longest = max(len(r.prompt_token_ids) for r in batch)
    input_ids = torch.full((len(batch), longest), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, request in enumerate(batch):
        length = len(request.prompt_token_ids)
        input_ids[row, longest - length :] = torch.tensor(request.prompt_token_ids)
        attention_mask[row, longest - length :] = 1
    return input_ids, attention_mask


@torch.no_grad()
def generate_batch(model: torch.nn.Module, batch: list[BenchRequest]) -> list[float]:
    """Run one static batch to its longest output; the time of each step."""
    pad_token_id = model.config.pad_token_id
    input_ids, attention_mask = left_padded(batch, pad_token_id)
    longest_output = max(r.output_len for r in batch)
    clock = StepClock()
    model.generate(  # type: ignore[operator]
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=longest_output,
        min_new_tokens=longest_output,
        do_sample=False,
        pad_token_id=pad_token_id,
        logits_processor=LogitsProcessorList([clock]),
    )
    return clock.times


def measure(args: argparse.Namespace, result: SystemResult) -> None:
    requests = load_workload(Path(args.workload))
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=DTYPES[args.dtype])
    model.eval()
    result.startup_s = time.perf_counter() - started
    generate_batch(model, requests[:2])  # untimed warm-up
    start = time.perf_counter()
    token_times: list[list[float]] = []
    for first in range(0, len(requests), BATCH_SIZE):
        batch = requests[first : first + BATCH_SIZE]
        times = generate_batch(model, batch)
        token_times.extend(times[: r.output_len] for r in batch)
        result.computed_tokens += len(batch) * len(times)
    result.elapsed_s = time.perf_counter() - start
    result.num_requests = len(requests)
    result.output_tokens = sum(len(t) for t in token_times)
    ttft, itl = token_latencies(start, token_times)
    result.ttft_s, result.itl_s = latency_summary(ttft), latency_summary(itl)


def main() -> None:
    parser = child_parser(__doc__)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = SystemResult(system=args.system, threads=torch.get_num_threads())
    measure(args, result)
    result.note = f"static batches of {BATCH_SIZE}, left padding"
    result.save(Path(args.out))


if __name__ == "__main__":
    main()
