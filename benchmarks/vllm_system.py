"""One vLLM system on the workload, in a fresh process: this plugin or vLLM CPU.

Requests are all added at once and the engine is stepped by hand, so each token's
arrival time is known: TTFT and every inter-token gap, not only per-request means.
Run by benchmarks.run; the vLLM native CPU peer runs this file with its own python.
"""

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.results_schema import SystemResult, latency_summary, token_latencies
from benchmarks.workload import BenchRequest, child_parser, load_workload

# One short untimed request first: allocators and lazy initialisations warm up.
WARMUP_REQUEST = BenchRequest(prompt_token_ids=list(range(100, 132)), output_len=8)


def sampling_params(output_len: int) -> Any:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        temperature=0.0,
        max_tokens=output_len,
        ignore_eos=True,
        output_kind=RequestOutputKind.DELTA,
    )


def run_requests(llm: Any, requests: list[BenchRequest]) -> tuple[float, list[Any]]:
    """Add every request, step until done; (start time, token times per request)."""
    engine = llm.llm_engine
    start = time.perf_counter()
    for index, request in enumerate(requests):
        prompt = {"prompt_token_ids": request.prompt_token_ids}
        engine.add_request(str(index), prompt, sampling_params(request.output_len))
    token_times: list[list[float]] = [[] for _ in requests]
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter()
        for output in outputs:
            new_tokens = len(output.outputs[0].token_ids)
            token_times[int(output.request_id)].extend([now] * new_tokens)
    return start, token_times


def record_run(
    result: SystemResult, num_requests: int, start: float, token_times: list[Any]
) -> None:
    """Elapsed time and token counts of a run from :func:`run_requests`."""
    result.elapsed_s = max(t[-1] for t in token_times) - start
    result.num_requests = num_requests
    result.output_tokens = result.computed_tokens = sum(len(t) for t in token_times)


def build_llm(args: argparse.Namespace, defaults: dict[str, Any] | None = None) -> Any:
    """The system's engine: ``defaults`` under the system's own ``--llm-kwargs``."""
    from vllm import LLM

    return LLM(
        model=args.model,
        dtype=args.dtype,
        seed=0,
        disable_log_stats=True,
        **(defaults or {}) | json.loads(args.llm_kwargs),
    )


def measure(args: argparse.Namespace, result: SystemResult) -> None:
    requests = load_workload(Path(args.workload))
    if args.plugin:
        from benchmarks.probes import install_plugin_probes

        install_plugin_probes()
    started = time.perf_counter()
    llm = build_llm(args)
    result.startup_s = time.perf_counter() - started
    run_requests(llm, [WARMUP_REQUEST])
    if args.plugin:
        from benchmarks.probes import reset_padding_stats

        llm.collective_rpc(reset_padding_stats)
    start, token_times = run_requests(llm, requests)
    record_run(result, len(requests), start, token_times)
    ttft, itl = token_latencies(start, token_times)
    result.ttft_s, result.itl_s = latency_summary(ttft), latency_summary(itl)
    if args.plugin:
        from benchmarks.probes import collect_plugin_figures

        collect_plugin_figures(llm, result)


def main() -> None:
    parser = child_parser(__doc__)
    parser.add_argument("--llm-kwargs", default="{}")
    parser.add_argument("--plugin", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = SystemResult(system=args.system, threads=torch.get_num_threads())
    measure(args, result)
    result.save(Path(args.out))


if __name__ == "__main__":
    main()
