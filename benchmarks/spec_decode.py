"""Tokens per second with and without speculative decoding (n-gram, a draft
model, the target's own MTP layer), the acceptance rate from vLLM's
spec-decode metrics, the padding of the passes, and whether the greedy
outputs equal those without speculation.

SmolLM2-135M-Instruct by default; its draft model by default is a two-layer
Llama distilled from it on generic prompts (scripts/build_draft_model.py,
built into .cache/models when missing, a few minutes; none ships offline, and
a SmolLM2 cut to its first layers is no draft: docs/spec-decode.md). Each configuration
runs in an engine of its own, in a child process; once all have started and
generated the batch once, the parent has them generate it in turn, round
after round (A/B interleaved), so a shared machine's changing load hits
every configuration alike: the ratios to no speculation are per round, and
their median is one figure. Within a round the engines take turns
``--repeats`` times, one generation each, and each counts its fastest: a
2-core virtual machine's speed wanders by 10-40 % over seconds, quiet or not,
so back-to-back generations of one engine share one slow spell where turns
spread it over all of them. Noise only ever adds time, so the other figure is
the ratio of each engine's fastest generation over all rounds to no
speculation's (``ratio_of_fastest``): what the engines can do. The load
average is printed with each round.

``--batch-size`` sets how many of the prompts each generate call sends at
once: all four by default (a batch, whose slowest request sets its time), 1
for one request at a time (the latency case speculation is for, where a
decode's compute sits idle).

With ``--pass-times`` each engine also reports its forward passes: per bucket,
how many ran in the timed rounds and their mean milliseconds, from the plugin's
step profiler (VLLM_PROFILER_ENABLED, its trace written to a temporary folder).

Run: VLLM_HPU_EMULATION=1 PYTHONPATH=$PWD python -m benchmarks.spec_decode
"""

import argparse
import dataclasses
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

DEFAULT_MODEL = ".cache/models/smollm2-135m-instruct"
DEFAULT_DRAFT = ".cache/models/smollm2-draft-192x2"
# Repetitive text, where prompt lookup has something to find: counting, a
# repeated sentence, a list, code that repeats its own pattern. (A list of
# fruit, in earlier versions, was continued in prose: SmolLM2 stops repeating.)
PROMPTS = [
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
    "The cat sat on the mat. The cat sat on the mat. The cat",
    "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, Monday, Tuesday,",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef",
]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--num-speculative-tokens", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--methods",
        default="ngram,draft_model",
        help="comma-separated proposers to compare with no speculation",
    )
    parser.add_argument(
        "--draft-model",
        default=DEFAULT_DRAFT,
        help="the draft_model proposer's model, sharing --model's tokenizer "
        "(the default is built when missing; --model drafts for itself)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds")
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="generations per engine and round; the fastest counts",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=len(PROMPTS),
        help="requests per generate call: the prompts in turn, this many at once",
    )
    parser.add_argument(
        "--pass-times",
        action="store_true",
        help="report each engine's forward passes per bucket (count, mean ms)",
    )
    args = parser.parse_args()
    if not 1 <= args.batch_size <= len(PROMPTS):
        parser.error(f"--batch-size must be 1 to {len(PROMPTS)} (the prompts)")
    return args


def speculative_configs(args: argparse.Namespace) -> dict[str, dict | None]:
    """Each configuration the run compares, no speculation first."""
    k = args.num_speculative_tokens
    known: dict[str, dict] = {
        "ngram": {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 3,
        },
        "draft_model": {
            "method": "draft_model",
            "model": args.draft_model,
            "num_speculative_tokens": k,
        },
        # The target's own MTP layer: --model must ship one (DeepSeek-V3,
        # Qwen3.5; tiny-deepseek-v3-mtp, tiny-qwen3.5-mtp and
        # tiny-qwen3.5-moe-mtp here).
        "mtp": {"method": "mtp", "num_speculative_tokens": k},
    }
    methods = args.methods.split(",")
    unknown = sorted(set(methods) - set(known))
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; choose from {sorted(known)}")
    if "draft_model" in methods and args.draft_model == DEFAULT_DRAFT:
        build_default_draft()
    if "draft_model" in methods and not Path(args.draft_model).is_dir():
        raise SystemExit(
            f"--draft-model {args.draft_model} does not exist: name a model "
            "folder sharing the target's tokenizer"
        )
    return {"none": None, **{method: known[method] for method in methods}}


def build_default_draft() -> None:
    """Distil the default draft from SmolLM2 unless the script's current
    version is built (it returns at once then)."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "build_draft_model.py"
    subprocess.run(
        [sys.executable, str(script), str(Path(DEFAULT_DRAFT).parent)], check=True
    )


def padding_ratios(worker: Any) -> dict[str, float]:
    """Each padding counter's share of padding (verification: ``verify``)."""
    stats = worker.model_runner.buckets.stats
    counters = {f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)}
    return {name: round(counter.ratio, 3) for name, counter in counters.items()}


def clear_step_spans(worker: Any) -> None:
    worker.model_runner.caps.profiler.events.clear()


def pass_times(worker: Any) -> dict[str, list[float]]:
    """Per forward pass kind and bucket: [count, mean ms] since the spans
    were last cleared."""
    durations: dict[str, list[float]] = {}
    for event in worker.model_runner.caps.profiler.events:
        if event["name"] == "forward":
            key = f"{event['args']['phase']} {event['args']['bucket']}"
            durations.setdefault(key, []).append(event["dur"] / 1e3)
    return {
        key: [len(values), round(statistics.fmean(values), 2)]
        for key, values in sorted(durations.items())
    }


def spec_counters(llm: Any) -> tuple[float, float]:
    """(draft tokens, accepted tokens) since the engine started."""
    metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    drafted = metrics.get("vllm:spec_decode_num_draft_tokens") or 0
    accepted = metrics.get("vllm:spec_decode_num_accepted_tokens") or 0
    return drafted, accepted


def generate_in_batches(llm: Any, params: Any, batch_size: int) -> list[Any]:
    """The prompts' outputs, ``batch_size`` requests per generate call."""
    return [
        output
        for begin in range(0, len(PROMPTS), batch_size)
        for output in llm.generate(
            PROMPTS[begin : begin + batch_size], params, use_tqdm=False
        )
    ]


def serve(
    conn: Connection, args: argparse.Namespace, speculative_config: dict | None
) -> None:
    """A child's engine: generate the prompts once in the timed runs' batches
    (first-run costs), then once per "run" from the parent, answering the
    seconds and the tokens; on "stop", the spec-decode counters and padding
    of every generation (and with ``--pass-times`` the timed rounds' passes)."""
    if args.pass_times:
        os.environ["VLLM_PROFILER_ENABLED"] = "1"
        os.environ["VLLM_HPU_PROFILE_DIR"] = tempfile.mkdtemp(prefix="spec_decode_")
    from vllm import LLM, SamplingParams

    from vllm_hpu.patches.torchvision_import import allow_torchvision_import

    allow_torchvision_import()
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        max_model_len=512,
        seed=0,
        kv_cache_memory_bytes=128 << 20,
        disable_log_stats=False,
        speculative_config=speculative_config,
    )
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    generate_in_batches(llm, params, args.batch_size)
    if args.pass_times:
        llm.collective_rpc(clear_step_spans)
    conn.send("ready")
    while conn.recv() == "run":
        started = time.perf_counter()
        outputs = generate_in_batches(llm, params, args.batch_size)
        seconds = time.perf_counter() - started
        conn.send((seconds, [list(o.outputs[0].token_ids) for o in outputs]))
    drafted, accepted = spec_counters(llm)
    conn.send(
        {
            "draft_tokens": drafted,
            "accepted_tokens": accepted,
            "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
            "padding": llm.collective_rpc(padding_ratios)[0],
            **(
                {"passes": llm.collective_rpc(pass_times)[0]} if args.pass_times else {}
            ),
        }
    )
    llm.llm_engine.engine_core.shutdown()


def start_engines(
    args: argparse.Namespace, configs: dict[str, dict | None]
) -> dict[str, tuple[Any, Connection]]:
    """One child per configuration, started together; returns once all are
    ready."""
    context = multiprocessing.get_context("spawn")
    children = {}
    for name, config in configs.items():
        parent_end, child_end = context.Pipe()
        process = context.Process(target=serve, args=(child_end, args, config))
        process.start()
        children[name] = (process, parent_end)
    for name, (_, conn) in children.items():
        if conn.recv() != "ready":
            raise RuntimeError(f"the {name} engine did not start")
    return children


def timed_rounds(
    children: dict[str, tuple[Any, Connection]], args: argparse.Namespace
) -> tuple[dict[str, list[float]], dict[str, list[list[int]]]]:
    """Tokens/s of each configuration per round (its fastest of ``--repeats``
    generations, the engines taking turns); the last tokens."""
    rates: dict[str, list[float]] = {name: [] for name in children}
    tokens: dict[str, list[list[int]]] = {}
    for index in range(args.rounds):
        fastest = dict.fromkeys(children, 0.0)
        for _ in range(args.repeats):
            for name, (_, conn) in children.items():
                conn.send("run")
                seconds, tokens[name] = conn.recv()
                rate = sum(len(t) for t in tokens[name]) / seconds
                fastest[name] = max(fastest[name], rate)
        for name, rate in fastest.items():
            rates[name].append(rate)
        ratios = {
            name: round(values[-1] / rates["none"][-1], 3)
            for name, values in rates.items()
            if name != "none"
        }
        load = [round(value, 2) for value in os.getloadavg()]
        print(json.dumps({"round": index, "load_average": load, "ratios": ratios}))
    return rates, tokens


def main() -> None:
    args = parse_args()
    configs = speculative_configs(args)
    children = start_engines(args, configs)
    try:
        rates, tokens = timed_rounds(children, args)
    finally:
        for _, conn in children.values():
            conn.send("stop")
    counters = {name: conn.recv() for name, (_, conn) in children.items()}
    for process, _ in children.values():
        process.join()
    for name, config in configs.items():
        summary = {
            "method": name,
            "draft": (config or {}).get("model"),
            "batch_size": args.batch_size,
            "tokens_per_s_median": round(statistics.median(rates[name]), 2),
            "tokens_per_s_fastest": round(max(rates[name]), 2),
            **counters[name],
        }
        if name != "none":
            ratios = [a / b for a, b in zip(rates[name], rates["none"], strict=True)]
            summary["ratio_to_none_median"] = round(statistics.median(ratios), 3)
            fastest_ratio = max(rates[name]) / max(rates["none"])
            summary["ratio_of_fastest"] = round(fastest_ratio, 3)
            summary["same_tokens_as_none"] = tokens[name] == tokens["none"]
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
