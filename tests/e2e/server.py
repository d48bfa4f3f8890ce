"""`vllm serve` on the plugin as a child process, for tests that speak HTTP to it.

The server runs in its own process group on 127.0.0.1, its engine in a second
process, as users run it; teardown stops the whole group and checks that no
process of it is left.
"""

import contextlib
import dataclasses
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest

from e2e.harness import SharedPool

READY_TIMEOUT_S = 300  # engine start plus warmup on a busy 2-core machine
STOP_TIMEOUT_S = 30
KV_CACHE_BYTES = 64 << 20


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_command(model_dir: str, port: int, extra_args: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        model_dir,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--kv-cache-memory-bytes",
        str(KV_CACHE_BYTES),
        *extra_args,
    ]


def wait_until_ready(
    process: subprocess.Popen,
    base_url: str,
    log: pathlib.Path,
    timeout_s: float = READY_TIMEOUT_S,
):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vllm serve exited early:\n{log_tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base_url}/health", timeout=5).status_code == 200:
                return
        time.sleep(1)
    raise TimeoutError(f"vllm serve not ready in {timeout_s} s:\n{log_tail(log)}")


def log_tail(log: pathlib.Path, num_lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-num_lines:])


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of process group ``pgid``."""
    members = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
    return members


def stop(process: subprocess.Popen) -> list[psutil.Process]:
    """SIGTERM the server's process group, SIGKILL it if it hangs; returns what
    is still alive afterwards: descendants seen before, or group members."""
    group: list[psutil.Process] = []
    with contextlib.suppress(psutil.NoSuchProcess):  # it may have exited already
        group.append(psutil.Process(process.pid))
        group += group[0].children(recursive=True)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=STOP_TIMEOUT_S)
    _, alive = psutil.wait_procs(group, timeout=STOP_TIMEOUT_S)
    return alive + group_members(process.pid)


def launch(
    command: list[str], env: dict[str, str], log: pathlib.Path
) -> subprocess.Popen:
    """Start ``command`` in its own process group (stopped as one), output in
    ``log``."""
    with log.open("wb") as log_file:
        return subprocess.Popen(
            command,
            env={**os.environ, **env},
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@contextlib.contextmanager
def vllm_server(
    model_dir: str, extra_args: list[str], env: dict[str, str], log: pathlib.Path
) -> Iterator[str]:
    """Yields the base URL of a ready server; raises if teardown leaves orphans."""
    port = free_port()
    process = launch(serve_command(model_dir, port, extra_args), env, log)
    try:
        base_url = f"http://127.0.0.1:{port}"
        wait_until_ready(process, base_url, log)
        yield base_url
    finally:
        alive = stop(process)
    assert not alive, f"processes left after shutdown: {alive}"


@dataclasses.dataclass(frozen=True)
class ServerSpec:
    """What a shared server is keyed by: tests of equal specs, in any module,
    share one server (the ``server_url`` fixture, tests/e2e/conftest.py, is
    its base URL). Shared servers get a Prometheus multiprocess folder, so an
    engine process's metrics reach /metrics."""

    model: str  # a name under .cache/models
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    name: str = dataclasses.field(compare=False)


def uses_servers(*specs: ServerSpec) -> pytest.MarkDecorator:
    """Runs the test once per spec, its ``server_url`` fixture the spec's server."""
    return pytest.mark.parametrize(
        "shared_server", specs, indirect=True, ids=[s.name for s in specs]
    )


@contextlib.contextmanager
def _start_shared(spec: ServerSpec) -> Iterator[str]:
    from models import model_path

    with tempfile.TemporaryDirectory(prefix=f"{spec.name}-") as workdir:
        prometheus = pathlib.Path(workdir) / "prometheus"
        prometheus.mkdir()
        env = dict(spec.env) | {"PROMETHEUS_MULTIPROC_DIR": str(prometheus)}
        log = pathlib.Path(workdir) / "server.log"
        with vllm_server(model_path(spec.model), list(spec.args), env, log) as url:
            yield url


SERVER_POOL = SharedPool(_start_shared)


# tiny-llama as a Gaudi user serves it (--device hpu), its engine in its own
# process: test_serve's API checks and test_gaudi_commands' completion.
TINY_LLAMA_SERVER = ServerSpec(
    model="tiny-llama",
    args=(
        *("--served-model-name", "tiny-llama", "--device", "hpu"),
        *("--dtype", "float32", "--seed", "0", "--enforce-eager"),
        *("--block-size", "16", "--max-model-len", "256", "--max-num-seqs", "64"),
    ),
    env=(("VLLM_HPU_EMULATION", "1"), ("VLLM_ENABLE_V1_MULTIPROCESSING", "1")),
    name="tiny-llama-server",
)
