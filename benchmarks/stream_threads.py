"""The same decode step on the host thread and on the device stream's thread.

SmolLM2 through transformers: one decode step of a batch over a prefilled cache
(cropped back after each step, so every step is the same), timed on the calling
thread, then on a device stream's worker thread (async scheduling's, in
emulation), then on the calling thread again. Two set-ups, each in a process of
its own: the plugin's (``device.device_stream``: every thread of device work
uses ``device.compute_threads()`` torch threads), and torch's default thread
count on both threads, as before the fix. With the default, the calling
thread's OpenMP team busy-waits between parallel regions at full spin until a
second team exists (libgomp then manages more threads than cores and throttles
its spinning): on a busy machine its steps are several times slower, until the
stream's thread has run once.

Run: VLLM_HPU_EMULATION=1 PYTHONPATH=$PWD python -m benchmarks.stream_threads
"""

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable

DEFAULT_MODEL = ".cache/models/smollm2-135m-instruct"
SETUPS = ("plugin", "torch-default")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--setup", choices=SETUPS, help="one set-up, in this process")
    return parser.parse_args()


def decode_step(args: argparse.Namespace) -> Callable[[], None]:
    """One decode step over a prefilled cache, the same every call."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.eval()
    generator = torch.Generator().manual_seed(0)
    shape = (args.batch_size, args.context)
    prompt = torch.randint(100, model.config.vocab_size, shape, generator=generator)
    with torch.no_grad():
        cache = model(input_ids=prompt, use_cache=True).past_key_values
    token = prompt[:, -1:]

    def step() -> None:
        with torch.no_grad():
            model(input_ids=token, past_key_values=cache, use_cache=True)
        cache.crop(args.context)

    return step


def ms_per_step(step: Callable[[], None], steps: int) -> float:
    step()  # untimed: first calls pay one-off costs
    started = time.perf_counter()
    for _ in range(steps):
        step()
    return 1e3 * (time.perf_counter() - started) / steps


def run_setup(args: argparse.Namespace) -> dict[str, float | int | str]:
    import torch

    from vllm_hpu import device
    from vllm_hpu.emulation.device_stream import DeviceStream
    from vllm_hpu.patches.torchvision_import import allow_torchvision_import

    allow_torchvision_import()  # transformers imports torchvision
    if args.setup == "plugin":
        stream = device.device_stream(queued=True)
    else:
        stream = DeviceStream(threaded=True)
    step = decode_step(args)
    host = ms_per_step(step, args.steps)
    on_stream = stream.submit(ms_per_step, step, args.steps).result()
    host_after = ms_per_step(step, args.steps)
    return {
        "setup": args.setup,
        "torch_threads": torch.get_num_threads(),
        "host_ms": round(host, 1),
        "stream_ms": round(on_stream, 1),
        "host_after_stream_ms": round(host_after, 1),
    }


def main() -> None:
    args = parse_args()
    if args.setup is not None:
        print(json.dumps(run_setup(args)))
        return
    print(
        f"| set-up | torch threads | decode step (batch {args.batch_size}, "
        f"{args.context} cached tokens) ms: host thread | stream thread | host "
        "thread, after the stream ran |"
    )
    print("|---|---|---|---|---|")
    for setup in SETUPS:
        command = [sys.executable, "-m", "benchmarks.stream_threads", *sys.argv[1:]]
        output = subprocess.run(
            [*command, f"--setup={setup}"], check=True, capture_output=True, text=True
        ).stdout
        row = json.loads(output.strip().splitlines()[-1])
        print(
            f"| {setup} | {row['torch_threads']} | {row['host_ms']} | "
            f"{row['stream_ms']} | {row['host_after_stream_ms']} |"
        )


if __name__ == "__main__":
    main()
