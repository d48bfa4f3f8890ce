"""Peak host memory of long prompt passes (issue 38): one prompt served whole on
the tiny long-context Llama in emulation, with attention cut into tiles
(VLLM_HPU_FSDPA_SLICE_*, the default) and, at a length where it still fits,
without; against the quadratic figure, the [q, K] fp32 mask one uncut pass holds.

Each run is a fresh process: the kernel's peak resident set (VmHWM) is reset
just before ``generate`` and read after it, so the figure is the serving step's
peak above the engine at rest (weights, KV cache and vLLM already counted).

    python -m benchmarks.long_prompt_memory [--lengths 16384 131056]
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MODEL = Path(".cache/models/tiny-llama3-128k")
MAX_MODEL_LEN = 131072
OUTPUT_TOKENS = 4
BYTES_PER_TOKEN = 512  # the tiny model's KV: 1 layer x (K + V) x 64 x fp32
MiB = 1 << 20


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def child(length: int) -> dict[str, float]:
    """Serve one prompt of ``length`` tokens; the step's peak memory above rest."""
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(MODEL),
        dtype="float32",
        max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=max(length, 2048),
        kv_cache_memory_bytes=(MAX_MODEL_LEN + 1024) * BYTES_PER_TOKEN,
        enforce_eager=True,
        seed=0,
    )
    prompt = {"prompt_token_ids": [3 + i * 7919 % 1021 for i in range(length)]}
    params = SamplingParams(temperature=0.0, max_tokens=OUTPUT_TOKENS, ignore_eos=True)
    at_rest = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to VmRSS
    started = time.perf_counter()
    llm.generate([prompt], params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    peak = _status_kib("VmHWM")
    llm.llm_engine.engine_core.shutdown()
    return {"peak_mib": (peak - at_rest) / 1024, "seconds": elapsed}


def run(length: int, sliced: bool) -> dict[str, float]:
    env = dict(os.environ)
    env.update(
        VLLM_HPU_EMULATION="1",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_HPU_FSDPA_SLICE_ENABLED=str(int(sliced)),
    )
    command = [sys.executable, "-m", "benchmarks.long_prompt_memory", "--child"]
    done = subprocess.run(
        [*command, str(length)], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def quadratic_mib(length: int) -> float:
    """The fp32 mask [q, K] of one uncut pass over the whole prompt."""
    return length * length * 4 / MiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lengths", type=int, nargs="+", default=[16384, 131056])
    parser.add_argument("--unsliced-up-to", type=int, default=16384)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child)))
        return
    print(
        "| prompt tokens | attention | peak above rest | quadratic (fp32 [q, K]) "
        "| share | step time |"
    )
    print("|---|---|---|---|---|---|")
    for length in args.lengths:
        for sliced in (False, True):
            if not sliced and length > args.unsliced_up_to:
                continue
            result = run(length, sliced)
            quadratic = quadratic_mib(length)
            print(
                f"| {length} | {'tiles' if sliced else 'whole'} | "
                f"{result['peak_mib']:.0f} MiB | {quadratic:.0f} MiB | "
                f"{result['peak_mib'] / quadratic:.1%} | {result['seconds']:.0f} s |",
                flush=True,
            )


if __name__ == "__main__":
    main()
