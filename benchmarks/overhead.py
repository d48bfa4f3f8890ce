"""Runner overhead per decode step at batch 1, 16 and 64, in a fresh plugin process.

Overhead = execute_model + sample_tokens - model forward - lm_head - sampler: the
host work of preparing inputs and building outputs. It transfers to Gaudi, where
the forward, lm_head and sampler run on the device. The sampler is reported apart.
"""

import argparse
import json
import random
import statistics
from pathlib import Path
from typing import Any

import torch

from benchmarks import probes
from benchmarks.results_schema import SystemResult
from benchmarks.vllm_system import run_requests
from benchmarks.workload import BenchRequest

BATCH_SIZES = (1, 16, 64)
PROMPT_LEN, DECODE_STEPS = 64, 32


def batch_requests(batch_size: int, vocab_size: int) -> list[BenchRequest]:
    rng = random.Random(batch_size)
    return [
        BenchRequest(
            [rng.randrange(100, vocab_size) for _ in range(PROMPT_LEN)], DECODE_STEPS
        )
        for _ in range(batch_size)
    ]


def _median_ms(steps: list[probes.StepTimes], part: str) -> float:
    return 1e3 * statistics.median(getattr(step, part) for step in steps)


def measure_batch(llm: Any, batch_size: int) -> dict[str, Any]:
    """Median milliseconds per part over the steps that decoded the full batch."""
    vocab_size = llm.llm_engine.model_config.get_vocab_size()
    probes.STEPS.clear()
    run_requests(llm, batch_requests(batch_size, vocab_size))
    steps = [s for s in probes.STEPS if s.decode_batch == batch_size]
    figures: dict[str, Any] = {"batch_size": batch_size, "steps": len(steps)}
    for part in ("input_and_output", "sampler", "forward", "logits", "execute"):
        figures[f"{part}_ms"] = _median_ms(steps, part)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--system", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--llm-kwargs", default="{}")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from vllm import LLM

    probes.install_step_timers()
    # Synchronous steps, so each part's time is its own (benchmarks/async_overlap.py
    # measures what async scheduling hides of it).
    kwargs = {"async_scheduling": False} | json.loads(args.llm_kwargs)
    llm = LLM(model=args.model, dtype=args.dtype, seed=0, **kwargs)
    measure_batch(llm, 1)  # untimed: first steps pay one-off costs
    result = SystemResult(system=args.system, threads=torch.get_num_threads())
    result.overhead = [measure_batch(llm, size) for size in BATCH_SIZES]
    result.save(Path(args.out))


if __name__ == "__main__":
    main()
