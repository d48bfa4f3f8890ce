"""A soak of ``vllm serve`` on the plugin: a bounded time of mixed traffic.

Concurrent clients on loopback send, for ``--minutes`` (10 by default), a mix of
plain and streamed completions and chats, streams they cancel after a few chunks,
bad requests (answered 400), prompts near ``max_model_len``, requests for
logprobs, and structured output (a choice). After a warm-up of the same traffic,
the server's memory (the resident memory of its processes, and the device
memory gauge ``vllm_hpu:device_memory_used_bytes``) and its compile counter are
read, then again at the end. It prints the requests completed, the outcomes by
kind, p50/p99 latency of the answered requests, both memories at start and end,
and the graphs compiled since the engine's warmup (the warm-up traffic
included); it exits 1 when a request was lost (a request neither answered nor
cancelled by its client: a timeout, a 5xx, a broken connection, an answer out
of its constraint, or requests left in the engine), when a memory grew by more
than 5 %, or when a graph was compiled after warmup.

Run (CPU emulation; the model compiled per bucket with torch.compile's eager
backend, so a shape missing from warmup shows as a compile):
    PYTHONPATH=$PWD VLLM_HPU_EMULATION=1 python benchmarks/soak.py [--minutes 1]
"""

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / ".cache" / "models"
MEMORY_DRIFT = 0.05  # the most either memory may grow from start to end
SERVED_NAME = "soak"
CHOICES = ["yes", "no", "maybe"]
KINDS = ("plain", "stream", "chat", "cancel", "bad", "long", "logprobs", "choice")
METRIC = re.compile(r"^([a-z_:]+)(\{[^}]*\})? ([0-9.e+-]+)$")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(MODELS / "smollm2-135m-instruct"))
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--warmup-minutes", type=float, default=1.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def start_server(args: argparse.Namespace, workdir: Path, port: int):
    """``vllm serve`` in a process group of its own, its log in ``workdir``."""
    prometheus = workdir / "prometheus"
    prometheus.mkdir()
    env = {
        **os.environ,
        "VLLM_HPU_EMULATION": "1",
        "VLLM_HPU_COMPILE_BACKEND": "eager",
        "PROMETHEUS_MULTIPROC_DIR": str(prometheus),
    }
    command = [
        sys.executable,
        *("-m", "vllm.entrypoints.cli.main", "serve", args.model),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--served-model-name", SERVED_NAME, "--seed", str(args.seed)),
        *("--max-model-len", str(args.max_model_len), "--max-num-seqs", "8"),
        *("--kv-cache-memory-bytes", str(256 << 20)),
    ]
    with (workdir / "server.log").open("wb") as log:
        return subprocess.Popen(
            command,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_ready(server: subprocess.Popen, url: str, timeout_s: float = 1800) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError("vllm serve exited while starting")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        time.sleep(2)
    raise TimeoutError("vllm serve did not start")


def stop_server(server: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGINT)  # as a terminal's Ctrl-C
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def metrics(url: str) -> dict[str, float]:
    """The server's Prometheus samples, summed over their labels."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    values: dict[str, float] = collections.defaultdict(float)
    for line in text.splitlines():
        match = METRIC.match(line)
        if match:
            values[match.group(1)] += float(match.group(3))
    return values


def resident_bytes(server: subprocess.Popen) -> int:
    """Resident memory of the server's processes (API server, engine core)."""
    root = psutil.Process(server.pid)
    total = 0
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += process.memory_info().rss
    return total


def reading(server: subprocess.Popen, url: str) -> dict[str, float]:
    """Memory and counters, once the engine holds no request (30 s at most: a
    request a client cancelled may still be aborting)."""
    deadline = time.monotonic() + 30
    values = metrics(url)
    while time.monotonic() < deadline and _in_engine(values):
        time.sleep(1)
        values = metrics(url)
    return {
        "resident": resident_bytes(server),
        "device": values.get("vllm_hpu:device_memory_used_bytes", 0.0),
        "compiled": values.get("vllm_hpu:compilations_after_warmup_total", 0.0),
        "running": values.get("vllm:num_requests_running", 0.0),
        "waiting": values.get("vllm:num_requests_waiting", 0.0),
    }


def _in_engine(values: dict[str, float]) -> float:
    return values.get("vllm:num_requests_running", 0.0) + values.get(
        "vllm:num_requests_waiting", 0.0
    )


async def _streamed(client: httpx.AsyncClient, path: str, body: dict, kind: str) -> str:
    """A streamed request read to its end: answered when it ends with [DONE]."""
    async with client.stream("POST", path, json=body) as reply:
        if reply.status_code != 200:
            return f"lost: {kind} {reply.status_code}"
        lines = [line async for line in reply.aiter_lines() if line]
    return "answered" if lines[-1] == "data: [DONE]" else f"lost: {kind} cut"


class Traffic:
    """One client's requests of every kind, and what became of them."""

    def __init__(self, url: str, vocab_size: int, max_model_len: int, seed: int):
        self.url = url
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.rng = random.Random(seed)
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.latencies: list[float] = []

    async def run(self, client: httpx.AsyncClient, until: float) -> None:
        while time.monotonic() < until:
            kind = self.rng.choice(KINDS)
            started = time.monotonic()
            try:
                outcome = await getattr(self, f"_{kind}")(client)
            except (httpx.HTTPError, ValueError, KeyError) as error:
                outcome = f"lost: {kind} {type(error).__name__}"
            self.outcomes[outcome] += 1
            if outcome == "answered":
                self.latencies.append(time.monotonic() - started)

    def _prompt(self) -> str:
        words = ["the", "sea", "red", "fruit", "seven", "sky", "paint", "cook"]
        return " ".join(self.rng.choices(words, k=self.rng.randrange(3, 40)))

    def _body(self, **extra: object) -> dict:
        tokens = self.rng.randrange(8, 48)
        return {"model": SERVED_NAME, "max_tokens": tokens, **extra}

    async def _plain(self, client: httpx.AsyncClient) -> str:
        reply = await client.post(
            "/v1/completions", json=self._body(prompt=self._prompt())
        )
        return _answered(reply, lambda r: r["choices"][0]["text"] is not None)

    async def _logprobs(self, client: httpx.AsyncClient) -> str:
        body = self._body(prompt=self._prompt(), logprobs=5)
        reply = await client.post("/v1/completions", json=body)
        return _answered(reply, lambda r: r["choices"][0]["logprobs"]["top_logprobs"])

    async def _choice(self, client: httpx.AsyncClient) -> str:
        body = self._body(prompt=self._prompt(), structured_outputs={"choice": CHOICES})
        reply = await client.post("/v1/completions", json=body)
        return _answered(reply, lambda r: r["choices"][0]["text"] in CHOICES)

    async def _long(self, client: httpx.AsyncClient) -> str:
        length = self.max_model_len - 48 - self.rng.randrange(0, 32)
        prompt = [self.rng.randrange(3, self.vocab_size) for _ in range(length)]
        body = self._body(prompt=prompt, max_tokens=16)
        reply = await client.post("/v1/completions", json=body)
        return _answered(reply, lambda r: r["usage"]["prompt_tokens"] == length)

    async def _bad(self, client: httpx.AsyncClient) -> str:
        body = self._body(prompt=self._prompt(), temperature=-1.0)
        reply = await client.post("/v1/completions", json=body)
        return (
            "rejected" if reply.status_code == 400 else f"lost: bad {reply.status_code}"
        )

    async def _stream(self, client: httpx.AsyncClient) -> str:
        body = self._body(prompt=self._prompt(), stream=True)
        return await _streamed(client, "/v1/completions", body, "stream")

    async def _chat(self, client: httpx.AsyncClient) -> str:
        messages = [{"role": "user", "content": self._prompt()}]
        body = self._body(messages=messages, stream=True)
        return await _streamed(client, "/v1/chat/completions", body, "chat")

    async def _cancel(self, client: httpx.AsyncClient) -> str:
        """A stream the client closes after a few chunks (the server aborts it)."""
        body = self._body(prompt=self._prompt(), stream=True, max_tokens=64)
        async with client.stream("POST", "/v1/completions", json=body) as reply:
            if reply.status_code != 200:
                return f"lost: cancel {reply.status_code}"
            chunks = 0
            async for line in reply.aiter_lines():
                chunks += bool(line)
                if chunks == 3:
                    return "cancelled"
        return "answered"  # it ended first


def _answered(reply: httpx.Response, valid) -> str:  # type: ignore[no-untyped-def]
    if reply.status_code != 200:
        return f"lost: {reply.status_code}"
    return "answered" if valid(reply.json()) else "lost: out of constraint"


async def serve_traffic(url: str, args: argparse.Namespace, seconds: float, seed: int):
    """Every client's traffic for ``seconds``; their outcomes and latencies."""
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    clients = [
        Traffic(url, vocab, args.max_model_len, seed * 1000 + i)
        for i in range(args.clients)
    ]
    until = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=args.clients * 2)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:
        await asyncio.gather(*(c.run(http, until) for c in clients))
    outcomes = sum((c.outcomes for c in clients), collections.Counter())
    latencies = [x for c in clients for x in c.latencies]
    return outcomes, latencies


def report(start: dict, end: dict, outcomes, latencies: list[float], minutes: float):
    """Prints the figures; returns the failed checks."""
    lost = {k: v for k, v in outcomes.items() if k.startswith("lost")}
    print(f"soak: {minutes:g} min of traffic")
    print(
        f"requests completed: {outcomes['answered']} answered, "
        f"{outcomes['cancelled']} cancelled by their client, "
        f"{outcomes['rejected']} bad requests answered 400"
    )
    print(f"errors by kind: {dict(lost) or 'none'}")
    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else []
    if quantiles:
        print(
            f"latency of answered requests: p50 {quantiles[49]:.2f} s, "
            f"p99 {quantiles[98]:.2f} s"
        )
    failures = [f"{n} {k}" for k, n in lost.items()]
    for name in ("resident", "device"):
        growth = end[name] / start[name] - 1 if start[name] else 0.0
        print(
            f"{name} memory: {start[name] / 2**20:.1f} MiB at start, "
            f"{end[name] / 2**20:.1f} MiB at end ({growth:+.1%})"
        )
        if growth > MEMORY_DRIFT:
            failures.append(f"{name} memory grew {growth:.1%}")
    # The counter starts at the engine's warmup: the soak's warm-up traffic counts.
    compiled = int(end["compiled"])
    window = compiled - int(start["compiled"])
    print(f"graphs compiled while serving: {compiled} ({window} in the timed part)")
    if compiled:
        failures.append(f"{compiled} graphs compiled after warmup")
    left = end["running"] + end["waiting"]
    if left:
        failures.append(f"{left:.0f} requests left in the engine")
    return failures


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="soak-") as folder:
        workdir, port = Path(folder), _free_port()
        url = f"http://127.0.0.1:{port}"
        server = start_server(args, workdir, port)
        try:
            wait_ready(server, url)
            asyncio.run(serve_traffic(url, args, args.warmup_minutes * 60, args.seed))
            start = reading(server, url)
            outcomes, latencies = asyncio.run(
                serve_traffic(url, args, args.minutes * 60, args.seed + 1)
            )
            end = reading(server, url)
        finally:
            stop_server(server)
            kept = Path(tempfile.gettempdir()) / "soak-server.log"
            (workdir / "server.log").replace(kept)
            print(f"server log: {kept}")
    failures = report(start, end, outcomes, latencies, args.minutes)
    print("checks: " + ("; ".join(failures) if failures else "all passed"))
    sys.exit(1 if failures else 0)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


if __name__ == "__main__":
    main()
