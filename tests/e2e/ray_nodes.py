"""Two Ray nodes on one machine, as two hosts would be: each node lives in its own
network namespace with its own address, the two joined by a veth pair, and runs
`ray start` there (the head, then a node joining it) with one emulated HPU.

Everything is created as root (``ip netns``, ``ip link``) and removed afterwards,
even on failure: every process left in a namespace is killed (Ray's daemons and
agents, the engine, its workers), then the namespaces, which takes their veth
ends with them. Nothing is configured in this machine's own namespace, and
each node keeps its Ray files in a folder of its own (never /tmp/ray, whose
``ray_current_cluster`` other drivers on this machine would join).
"""

import contextlib
import dataclasses
import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import psutil

SUBNET = "10.213.0"
RAY_PORT = 6379
START_TIMEOUT_S = 180  # two `ray start` together on a busy 2-core machine
KILL_WAIT_S = 10
NEEDS = "needs root and iproute2 (`ip netns`, `ip link ... type veth`)"


@dataclasses.dataclass(frozen=True)
class Node:
    namespace: str
    interface: str  # its end of the veth pair
    address: str
    temp_dir: pathlib.Path

    def command(self, *args: str) -> list[str]:
        """``args`` run inside this node's network namespace."""
        return ["ip", "netns", "exec", self.namespace, *args]

    def env(self, cluster_env: dict[str, str]) -> dict[str, str]:
        """What a process on this node runs with: the node's own address
        (``VLLM_HOST_IP``, whose interface the plugin hands gloo)."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("RAY_") and k != "GLOO_SOCKET_IFNAME"
        }
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        return {
            **env,
            **cluster_env,
            "VLLM_HOST_IP": self.address,
        }

    def pids(self) -> list[int]:
        listed = subprocess.run(
            ["ip", "netns", "pids", self.namespace], capture_output=True, text=True
        )
        return [int(pid) for pid in listed.stdout.split()]


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed ({NEEDS}): {result.stderr}")


def _link_up(nodes: tuple[Node, Node]) -> None:
    _ip("link", "add", nodes[0].interface, "type", "veth", "peer", nodes[1].interface)
    for node in nodes:
        _ip("link", "set", node.interface, "netns", node.namespace)
        inside = ("-n", node.namespace)
        _ip(*inside, "addr", "add", f"{node.address}/24", "dev", node.interface)
        _ip(*inside, "link", "set", node.interface, "up")
        _ip(*inside, "link", "set", "lo", "up")


def _kill_all(node: Node) -> None:
    """Every process in the node's namespace: SIGTERM, then SIGKILL (Ray's
    agents ignore SIGTERM)."""
    procs = []
    for pid in node.pids():
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
            os.kill(pid, signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=KILL_WAIT_S)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=KILL_WAIT_S)


@contextlib.contextmanager
def two_namespaces() -> Iterator[tuple[Node, Node]]:
    """Namespaces ``hpuXXXXn0`` (10.213.0.1) and ``...n1`` (10.213.0.2), linked;
    Ray's folders in a short temporary one (Ray's socket paths are long)."""
    tag = f"hpu{secrets.token_hex(3)}"
    work_dir = pathlib.Path(tempfile.mkdtemp(prefix="ray-"))
    nodes = tuple(
        Node(f"{tag}n{i}", f"{tag}v{i}", f"{SUBNET}.{i + 1}", work_dir / f"ray{i}")
        for i in range(2)
    )
    made = []
    try:
        for node in nodes:
            _ip("netns", "add", node.namespace)
            made.append(node)
        _link_up(nodes)
        yield nodes
    finally:
        for node in made:
            _kill_all(node)
            subprocess.run(["ip", "netns", "del", node.namespace], check=False)
        shutil.rmtree(work_dir, ignore_errors=True)


def _ray_start(node: Node, head: Node, env: dict[str, str]) -> subprocess.Popen:
    where = ["--head", "--port", str(RAY_PORT), "--include-dashboard", "false"]
    if node is not head:
        where = ["--address", f"{head.address}:{RAY_PORT}"]
    ray = str(pathlib.Path(sys.executable).with_name("ray"))
    command = node.command(
        ray, "start", *where,
        "--node-ip-address", node.address,
        "--num-cpus", "0",
        "--resources", '{"HPU": 1}',
        "--object-store-memory", str(100 << 20),
        "--temp-dir", str(node.temp_dir),
        "--disable-usage-stats",
    )  # fmt: skip
    return subprocess.Popen(
        command,
        env=node.env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@contextlib.contextmanager
def ray_cluster(nodes: tuple[Node, Node]) -> Iterator[dict[str, str]]:
    """`ray start --head` on the first node and `ray start --address` on the
    second, together (the second retries until the head answers); yields the
    variables a driver on the head needs (the address, the cluster's token).
    The namespaces' teardown stops the cluster."""
    head = nodes[0]
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    starts = [_ray_start(node, head, env) for node in nodes]
    deadline = time.monotonic() + START_TIMEOUT_S
    for node, start in zip(nodes, starts, strict=True):
        out, _ = start.communicate(timeout=max(1.0, deadline - time.monotonic()))
        if start.returncode != 0:
            raise RuntimeError(f"ray start on {node.address} failed:\n{out[-3000:]}")
    yield {**env, "RAY_ADDRESS": f"{head.address}:{RAY_PORT}"}


def ray_workers(node: Node) -> list[psutil.Process]:
    """vLLM's Ray worker actors running on the node."""
    found = []
    for pid in node.pids():
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if " ".join(proc.cmdline()).startswith("ray::RayWorker"):
                found.append(proc)
    return found


def wait_for_no_workers(nodes: tuple[Node, ...]) -> list[psutil.Process]:
    """vLLM's Ray workers still alive on ``nodes`` after a short wait."""
    deadline = time.monotonic() + KILL_WAIT_S
    while (left := [p for node in nodes for p in ray_workers(node)]) and (
        time.monotonic() < deadline
    ):
        time.sleep(1)
    return left
