"""MoE decode at small batch (issue 53): the expert bytes one decode step reads
against the bytes of the experts its tokens route to, and decode tokens/s of a
model with 64 experts against the same model with 8 (same expert size, top-k).

For each expert format (bf16; fp8 in DeepSeek's 128 x 128 blocks; 4-bit AWQ,
group 128, both written by the tests' writers, tests/moe_checkpoints.py) and
each top-k, a random Qwen3-MoE (hidden 512, experts of intermediate size 512,
2 layers) is written with 64 and with 8 experts. Each model runs in its own
child process, in an in-process engine (bf16, eager). For each batch size:

- bytes: one decode step of ``batch`` requests runs under a meter (a torch
  dispatch mode) that adds, for every op the MoE layers run, the bytes it
  reads from their expert tensors (weights, scales, zero points): a gather,
  the rows it takes; torch's CPU grouped GEMM, the experts with rows (it
  multiplies group by group); any other op, the whole view it is given (view
  ops read nothing). The routed bytes: the experts the requests' (token, k) pairs
  route to, from the engine's own routing, times one expert's bytes. (A
  batch between two decode buckets is padded to the larger: the padding
  rows' experts are read, not routed.)
- tokens/s: ``batch`` requests of 8 prompt tokens, greedy, ``--tokens`` new
  tokens: ``batch`` over vLLM's mean inter-token latency (the prefill is not
  in it), and the decoded tokens per CPU second of the engine's process (its
  prefill's less), which a shared host's other processes do not inflate; the
  fastest of ``--repeats`` rounds, in which the two models' child processes
  take turns (a busy host slows both alike).

Targets (batch 1): bytes read at most 1.25x the routed bytes; 64-expert decode
within 1.3x of the 8-expert model's time per token (judged on CPU time: on a
shared 2-core host wall times wander 2-4x).
Run: VLLM_HPU_EMULATION=1 PYTHONPATH=$PWD python -m benchmarks.moe_decode
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

REPO = Path(__file__).resolve().parent.parent
FORMATS = ("bf16", "fp8-block", "awq-g128")
BATCHES = (1, 4, 16, 64)
PROMPT_LEN = 8
BYTES_TARGET, SPEED_TARGET = 1.25, 1.3
# Ops that hand out rows of a tensor: they read the rows they take.
GATHERS = {"index.Tensor", "index_select.default", "embedding.default"}


def build_moe(path: Path, num_experts: int, top_k: int) -> None:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=1024,
        hidden_size=512,
        moe_intermediate_size=512,
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=128,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(config).to(torch.bfloat16).save_pretrained(path)


def write_format(bf16: Path, out: Path, name: str) -> Path:
    if name == "bf16":
        return bf16
    sys.path.insert(0, str(REPO / "tests"))  # the tests' checkpoint writers
    from moe_checkpoints import Fp8Experts, write_moe_checkpoints
    from quant_checkpoints import Scheme

    scheme = Fp8Experts() if name == "fp8-block" else Scheme("awq", group_size=128)
    return write_moe_checkpoints(bf16, out, scheme)[0]


class ExpertBytesMeter(TorchDispatchMode):
    """Bytes the ops read from some tensors' storage (see the module doc)."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        super().__init__()
        self.storages = {t.untyped_storage().data_ptr() for t in tensors}
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.is_view:
            return out
        name = f"{func._schema.name.split('::')[-1]}.{func._overloadname}"
        for arg in tree_leaves((args, kwargs)):
            if not isinstance(arg, torch.Tensor):
                continue
            if arg.untyped_storage().data_ptr() in self.storages:
                self.bytes += bytes_read(name, arg, args, kwargs, out)
        return out


def bytes_read(name: str, arg: torch.Tensor, args, kwargs, out) -> int:  # type: ignore[no-untyped-def]
    """What an op reads of ``arg``: a gather the rows it takes; torch's CPU
    grouped GEMM the groups with rows (ATen's ``_grouped_mm`` fallback
    multiplies group by group, an empty group reads nothing); any other op
    the whole view it is given."""
    if name in GATHERS:
        return out.numel() * out.element_size()
    if name == "_grouped_mm.default" and arg is args[1]:
        offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
        rows = torch.diff(offs, prepend=offs.new_zeros(1))
        return int((rows > 0).sum()) * arg[0].numel() * arg.element_size()
    return arg.numel() * arg.element_size()


def expert_tensors(layer: Any) -> list[torch.Tensor]:
    """The layer's per-expert tensors (first dimension: its experts)."""
    num = layer.local_num_experts
    return [p for p in layer.parameters() if p.ndim and p.shape[0] == num]


STEPS: list[dict[str, Any]] = []  # the metered MoE calls of this child


def meter_experts(model: Any) -> None:
    """Wrap each MoE layer's method: every call records its tokens, the bytes
    it read, one expert's bytes and the experts each token routed to."""
    from vllm.model_executor.layers.fused_moe import RoutedExperts

    from vllm_hpu.ops.fused_moe import route

    for layer in model.modules():
        if not isinstance(layer, RoutedExperts):
            continue
        method, tensors = layer.quant_method, expert_tensors(layer)
        expert_bytes = sum(t[0].numel() * t.element_size() for t in tensors)

        def metered(layer, x, router_logits, *args, _run=method.apply_monolithic,
                    _tensors=tensors, _bytes=expert_bytes, **kwargs):  # type: ignore[no-untyped-def]  # fmt: skip
            weights, ids = route(layer, x, router_logits)
            with ExpertBytesMeter(_tensors) as meter:
                out = _run(layer, x, router_logits, *args, **kwargs)
            STEPS.append(
                {
                    "read": meter.bytes,
                    "expert": _bytes,
                    "routed": ids.where(weights != 0, -1),
                }
            )
            return out

        method.apply_monolithic = metered


def inter_token_latency(llm: Any) -> tuple[float, float]:
    """(sum of seconds, count) of vLLM's inter-token latency so far."""
    for metric in llm.get_metrics():
        if metric.name == "vllm:inter_token_latency_seconds":
            return metric.sum, metric.count
    raise SystemExit("vLLM reported no inter-token latency")


def decode_rate(llm: Any, batch: int, tokens: int) -> dict[str, float]:
    """Decode tokens/s of ``batch`` requests: ``wall``, batch over the mean
    time between two tokens of a request (vLLM's inter-token latency: the
    prefill and the first token are not in it); ``cpu``, the decoded tokens
    over the CPU seconds the process spent on them (a ``tokens`` generation's
    less a one-token one's: the prefill's), which other processes on a shared
    host do not inflate."""
    from vllm import SamplingParams

    prompts = [
        {"prompt_token_ids": [3 + (7 * i + j) % 1000 for j in range(PROMPT_LEN)]}
        for i in range(batch)
    ]

    def generate(max_tokens: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        started = time.process_time()
        llm.generate(prompts, params, use_tqdm=False)
        return time.process_time() - started

    prefill_cpu = generate(1)
    before = inter_token_latency(llm)
    decode_cpu = generate(tokens) - prefill_cpu
    after = inter_token_latency(llm)
    return {
        "wall": batch * (after[1] - before[1]) / (after[0] - before[0]),
        "cpu": batch * (tokens - 1) / decode_cpu,
    }


def expert_bytes(llm: Any, batch: int) -> dict[str, int]:
    """Bytes read from the experts and the routed experts' bytes in one decode
    step of ``batch`` requests (metered by ``meter_experts``): the MoE calls
    of the second and last step. Its pass may be padded to a larger bucket:
    the padding rows are read for, but only the requests' tokens' experts
    count as routed."""
    from vllm import SamplingParams

    STEPS.clear()
    prompts = [{"prompt_token_ids": [5 + i] * PROMPT_LEN} for i in range(batch)]
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)
    num_layers = llm.apply_model(count_moe_layers)[0]
    decode = STEPS[-num_layers:]
    routed = 0
    for call in decode:
        experts = call["routed"][:batch].unique()
        routed += int((experts >= 0).sum()) * call["expert"]
    return {"read": sum(c["read"] for c in decode), "routed": routed}


def count_moe_layers(model: Any) -> int:
    from vllm.model_executor.layers.fused_moe import RoutedExperts

    return sum(isinstance(m, RoutedExperts) for m in model.modules())


def child(model_dir: str, max_batch: int) -> None:
    """An engine answering the parent's lines: ``rate BATCH TOKENS``,
    ``bytes BATCH`` (the meter stays on after), ``quit``; one JSON line each."""
    from vllm import LLM

    llm = LLM(
        model=model_dir, dtype="bfloat16", enforce_eager=True, seed=0,
        skip_tokenizer_init=True, max_model_len=128, max_num_seqs=max_batch,
        kv_cache_memory_bytes=256 << 20, disable_log_stats=False,
    )  # fmt: skip
    metered = False
    print("READY", flush=True)
    for line in sys.stdin:
        command, *numbers = line.split()
        if command == "quit":
            break
        if command == "rate":
            answer: Any = decode_rate(llm, int(numbers[0]), int(numbers[1]))
        else:
            if not metered:
                llm.apply_model(meter_experts)
                metered = True
            answer = expert_bytes(llm, int(numbers[0]))
        print("ANSWER " + json.dumps(answer), flush=True)


class Child:
    """A child process running ``child`` on one model."""

    def __init__(self, model: Path, max_batch: int) -> None:
        command = [
            sys.executable, "-m", "benchmarks.moe_decode", "--child", str(model),
            "--batches", str(max_batch),
        ]  # fmt: skip
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, env=env, cwd=REPO,
        )  # fmt: skip
        self.model = model
        self._wait_for("READY")

    def _wait_for(self, prefix: str) -> str:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(prefix):
                return line.removeprefix(prefix).strip()
        raise SystemExit(f"{self.model}: the child stopped (run it alone to see why)")

    def ask(self, command: str) -> Any:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return json.loads(self._wait_for("ANSWER "))

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("quit\n")
        self.process.stdin.close()
        self.process.wait(timeout=120)


def measure(models: list[Path], args: argparse.Namespace) -> list[dict[int, dict]]:
    """Per model, per batch: the fastest decode rate of ``--repeats`` rounds
    (the models take turns in each, so a busy host slows both alike), then
    the bytes of one metered decode step."""
    children = [Child(model, max(args.batches)) for model in models]
    try:
        results: list[dict[int, dict]] = [
            {b: {"wall": 0.0, "cpu": 0.0} for b in args.batches} for _ in children
        ]
        for _ in range(args.repeats):
            for batch in args.batches:
                for child_, result in zip(children, results, strict=True):
                    rates = child_.ask(f"rate {batch} {args.tokens}")
                    for kind, rate in rates.items():
                        result[batch][kind] = max(result[batch][kind], rate)
        for child_, result in zip(children, results, strict=True):
            for batch in args.batches:
                result[batch] |= child_.ask(f"bytes {batch}")
        return results
    finally:
        for child_ in children:
            child_.close()


def report(name: str, top_k: int, many: dict[int, dict], few: dict[int, dict]) -> None:
    """One table: 64 experts' bytes, then decode tokens/s of 64 and 8 experts
    (wall, and per CPU second) and 64 experts' time per token over 8's."""
    print(f"\n{name}, top-{top_k}:")
    print(
        "batch  read MiB  routed MiB  read/routed  wall tok/s 64 / 8  64/8"
        "   cpu tok/s 64 / 8  64/8"
    )
    for batch in sorted(many):
        m, f = many[batch], few[batch]
        ratio = m["read"] / m["routed"]
        wall, cpu = f["wall"] / m["wall"], f["cpu"] / m["cpu"]
        verdict = ""
        if batch == 1:
            met = ratio <= BYTES_TARGET and cpu <= SPEED_TARGET
            verdict = "  target " + ("met" if met else "MISSED")
        print(
            f"{batch:5d}  {m['read'] / 2**20:8.2f}  {m['routed'] / 2**20:10.2f}"
            f"  {ratio:11.2f}  {m['wall']:8.1f} / {f['wall']:6.1f}  {wall:4.2f}"
            f"  {m['cpu']:8.1f} / {f['cpu']:6.1f}  {cpu:4.2f}{verdict}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--formats", nargs="+", default=list(FORMATS))
    parser.add_argument("--top-k", nargs="+", type=int, default=[2, 8])
    parser.add_argument("--batches", nargs="+", type=int, default=list(BATCHES))
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, max(args.batches))
        return
    with tempfile.TemporaryDirectory() as folder:
        for top_k in args.top_k:
            for fmt in args.formats:
                models = []
                for num_experts in (64, 8):
                    out = Path(folder) / f"{fmt}-{num_experts}-{top_k}"
                    bf16 = out / "bf16"
                    build_moe(bf16, num_experts, top_k)
                    models.append(write_format(bf16, out, fmt))
                report(fmt, top_k, *measure(models, args))


if __name__ == "__main__":
    main()
