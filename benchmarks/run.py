"""The benchmark entry point: every system on the same workload, one after another.

    .venv/bin/python -m benchmarks.run --num-requests 64 --dtype float32

Each system runs in its own fresh process with the same torch thread count; the
results land in benchmarks/results/<date>-<dtype>.md with PNG plots (raw JSON
beside them is git-ignored). See docs/benchmarks.md.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks import peer, report
from benchmarks.results_schema import SystemResult
from benchmarks.systems import (
    HF_CHILD,
    OVERHEAD_CHILD,
    OVERHEAD_SYSTEM,
    PROFILE_CHILD,
    SYSTEMS,
    System,
)
from benchmarks.workload import (
    QUICK_OUTPUT_MAX,
    WorkloadSpec,
    describe,
    make_workload,
    save_workload,
    tokenizer_token_ids,
)

MODEL = Path(".cache/models/smollm2-135m-instruct")
RESULTS = Path("benchmarks/results")
LOGS = Path(".cache/benchmarks")
QUICK_REQUESTS = 8
DTYPES = ("float32", "bfloat16")


def child_env(system: System, threads: int) -> dict[str, str]:
    """The parent's environment without the plugin's switches, plus the system's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_HPU_")}
    cpus = sorted(os.sched_getaffinity(0))[:threads]
    env |= {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "OMP_NUM_THREADS": str(threads),
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cpus)),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    return env | system.env


def child_command(
    module: str, system: System, args: argparse.Namespace, out: Path
) -> list[str]:
    """Arguments every child takes; vLLM children also get the engine's kwargs."""
    command = ["-m", module, "--system", system.name, "--model", str(args.model)]
    command += [
        "--dtype",
        args.dtype,
        "--threads",
        str(args.threads),
        "--out",
        str(out),
    ]
    if module != HF_CHILD:
        command += ["--llm-kwargs", json.dumps(system.llm_kwargs)]
    return command


def run_child(
    system: System, command: list[str], python: str, out: Path, threads: int
) -> SystemResult:
    """Run one child to completion (results in ``out``); its log goes to LOGS."""
    log = LOGS / f"{out.stem}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    print(f"[{system.name}] running (log: {log})", flush=True)
    with log.open("w") as sink:
        done = subprocess.run(
            [python, *command],
            env=child_env(system, threads),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    if done.returncode != 0 or not out.exists():
        tail = log.read_text().strip().splitlines()[-1:] or ["no output"]
        note = f"exit {done.returncode}: {tail[0][:200]} (see {log})"
        print(f"[{system.name}] FAILED: {note}", flush=True)
        return SystemResult(system=system.name, status="failed", note=note)
    return SystemResult.load(out)


def run_system(system: System, args: argparse.Namespace) -> SystemResult:
    if system.opt_in and system.name not in (args.systems or []):
        print(f"[{system.name}] left out: {system.opt_in}", flush=True)
        return SystemResult(system=system.name, status="left out", note=system.opt_in)
    python = sys.executable
    if system.peer:
        peer_python, why = peer.ensure_peer()
        if peer_python is None:
            print(f"[{system.name}] SKIPPED: {why}", flush=True)
            return SystemResult(system=system.name, status="skipped", note=why)
        python = str(peer_python)
    out = RESULTS / f"{args.stamp}-{system.slug}.json"
    command = child_command(system.child, system, args, out)
    command += ["--workload", str(args.workload)]
    if system.plugin:
        command.append("--plugin")
    return run_child(system, command, python, out, args.threads)


def run_overhead(args: argparse.Namespace) -> SystemResult:
    out = RESULTS / f"{args.stamp}-overhead.json"
    command = child_command(OVERHEAD_CHILD, OVERHEAD_SYSTEM, args, out)
    return run_child(OVERHEAD_SYSTEM, command, sys.executable, out, args.threads)


def run_profile(args: argparse.Namespace) -> SystemResult:
    """The default plugin system once more on the workload, under torch.profiler."""
    out = RESULTS / f"{args.stamp}-profile.json"
    command = child_command(PROFILE_CHILD, OVERHEAD_SYSTEM, args, out)
    command += ["--workload", str(args.workload)]
    return run_child(OVERHEAD_SYSTEM, command, sys.executable, out, args.threads)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument(
        "--quick", action="store_true", help="8 requests, outputs 16..32 (development)"
    )
    parser.add_argument(
        "--systems", nargs="*", help="names of systems to run (default: all)"
    )
    parser.add_argument("--no-overhead", action="store_true")
    parser.add_argument(
        "--profile",
        action="store_true",
        help=f"also profile {OVERHEAD_SYSTEM.name} by operator (one more run)",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    spec = WorkloadSpec(args.num_requests, args.seed)
    if args.quick:
        spec = WorkloadSpec(QUICK_REQUESTS, args.seed, output_max=QUICK_OUTPUT_MAX)
    date = datetime.date.today().isoformat()
    args.stamp = f"{date}-{args.dtype}" + ("-quick" if args.quick else "")
    requests = make_workload(spec, tokenizer_token_ids(str(args.model)))
    args.workload = RESULTS / f"{args.stamp}-workload.json"
    save_workload(requests, args.workload)
    print(f"Workload: {describe(requests)} -> {args.workload}", flush=True)
    chosen = [s for s in SYSTEMS if not args.systems or s.name in args.systems]
    results = [run_system(system, args) for system in chosen]
    overhead = None if args.no_overhead else run_overhead(args)
    profile = run_profile(args) if args.profile else None
    context = report.RunContext(
        args.stamp, args.dtype, args.threads, describe(requests)
    )
    report.write_report(context, results, overhead, RESULTS, profile)


if __name__ == "__main__":
    main()
