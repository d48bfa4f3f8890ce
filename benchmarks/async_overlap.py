"""Host time on the critical path per decode step, async scheduling off and on.

Per decode step at batch 1, 16 and 64 (64-token prompts, 32 output tokens): the
wall time, the device's busy time (the device stream's,
``vllm_hpu/emulation/device_stream.py``: passes, logits, sampling) and their
difference, the time the device waited for the host (vLLM's scheduler and
output processing, the runner's preparation).
Async on should hide most of it behind the device. Async off, the device work
runs on the host thread, on, on the stream's thread: with the same torch
threads (``device.compute_threads``) their device times per step agree, apart
from the stream's waits for the GIL. Steps are those that decoded the whole
batch; the engine runs in this process, without warmup.

Run: VLLM_HPU_EMULATION=1 PYTHONPATH=$PWD python -m benchmarks.async_overlap
"""

import argparse
import functools
import gc
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_SKIP_WARMUP", "true")

DEFAULT_MODEL = ".cache/models/smollm2-135m-instruct"
BATCH_SIZES = (1, 16, 64)
PROMPT_LEN, DECODE_STEPS = 64, 32


@dataclass
class StepStart:
    at: float  # perf_counter when execute_model was called
    device_busy_s: float  # the stream's busy time so far
    decode_batch: int  # sequences decoded; 0 when the step held a prompt chunk


STEPS: list[StepStart] = []


def _record_steps(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def execute_model(self: Any, scheduler_output: Any, *args: Any) -> Any:
        sizes = list(scheduler_output.num_scheduled_tokens.values())
        decode_batch = len(sizes) if sizes and max(sizes) == 1 else 0
        STEPS.append(StepStart(time.perf_counter(), self.stream.busy_s, decode_batch))
        return method(self, scheduler_output, *args)

    return execute_model


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="float32")
    return parser.parse_args()


def measure_batch(llm: Any, batch_size: int) -> dict[str, float]:
    """Milliseconds per step over the steps that decoded the whole batch."""
    from vllm import SamplingParams

    vocab_size = llm.llm_engine.model_config.get_vocab_size()
    rng = random.Random(batch_size)
    token_ids = [
        [rng.randrange(100, vocab_size) for _ in range(PROMPT_LEN)]
        for _ in range(batch_size)
    ]
    prompts = [{"prompt_token_ids": ids} for ids in token_ids]
    params = SamplingParams(temperature=0.0, max_tokens=DECODE_STEPS, ignore_eos=True)
    STEPS.clear()
    llm.generate(prompts, params, use_tqdm=False)
    full = [s for s in STEPS if s.decode_batch == batch_size]
    first, last, count = full[0], full[-1], len(full) - 1
    wall = (last.at - first.at) / count
    busy = (last.device_busy_s - first.device_busy_s) / count
    return {
        "batch_size": batch_size,
        "steps": count,
        "wall_ms": round(1e3 * wall, 2),
        "device_ms": round(1e3 * busy, 2),
        "host_critical_ms": round(1e3 * (wall - busy), 2),
    }


def run(args: argparse.Namespace, async_scheduling: bool) -> list[dict[str, float]]:
    from vllm import LLM
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        max_model_len=512,
        max_num_seqs=max(BATCH_SIZES),
        max_num_batched_tokens=2048,
        seed=0,
        # Sized explicitly: a second engine in this process cannot profile memory.
        kv_cache_memory_bytes=512 << 20,  # the batch of 64 without preemption
        async_scheduling=async_scheduling,
    )
    measure_batch(llm, 1)  # untimed: first steps pay one-off costs
    figures = [measure_batch(llm, size) for size in BATCH_SIZES]
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()
    return figures


def main() -> None:
    from vllm_hpu.patches.torchvision_import import allow_torchvision_import
    from vllm_hpu.worker.model_runner import HpuModelRunner

    allow_torchvision_import()
    HpuModelRunner.execute_model = _record_steps(  # type: ignore[method-assign]
        HpuModelRunner.execute_model
    )
    args = parse_args()
    off, on = run(args, False), run(args, True)
    print(
        "| batch | device ms/step, off (host thread) / on (stream thread) | host on "
        "critical path, async off / on (ms/step) | hidden |"
    )
    print("|---|---|---|---|")
    for a, b in zip(off, on, strict=True):
        hidden = 1 - b["host_critical_ms"] / a["host_critical_ms"]
        print(
            f"| {a['batch_size']} | {a['device_ms']} / {b['device_ms']} "
            f"| {a['host_critical_ms']} / {b['host_critical_ms']} "
            f"| {100 * hidden:.0f} % |"
        )
    hidden = 1 - on[-1]["host_critical_ms"] / off[-1]["host_critical_ms"]
    print(json.dumps({"off": off, "on": on, "hidden_at_64": round(hidden, 3)}))


if __name__ == "__main__":
    main()
