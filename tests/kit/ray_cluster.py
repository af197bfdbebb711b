"""A private Ray cluster for tests and benchmarks: a head and a second node on 127.0.0.1.

Both are `ray start --block` processes in their own process groups, started with token
authentication and an environment that holds no Anthropic key (a cluster is the user's
infrastructure, not the coordinator's), and stopped by their process groups: never
`ray stop`, which stops every Ray process on the machine, other people's too.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

RAY = Path(sys.executable).with_name("ray")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class LocalRayCluster:
    ENV_NAMES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")
    address: str
    """`127.0.0.1:PORT`, the head's GCS."""
    token: str
    env: dict[str, str]
    """What a driver needs (the auth mode and token), to add to a process's environment."""
    temp_dir: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def members(self) -> set[int]:
        """Pids of every live process of the cluster: its nodes, their daemons and workers
        (the actors), and whatever those started."""
        import psutil

        found: set[int] = set()
        for process in self.processes:
            try:
                root = psutil.Process(process.pid)
                found |= {root.pid, *(p.pid for p in root.children(recursive=True))}
            except psutil.NoSuchProcess:
                continue
        return found

    def stop(self) -> None:
        """Stop every node by its process group (SIGTERM, 10 s, SIGKILL)."""
        for process in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 3
        for process in reversed(self.processes):
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if not os.environ.get("WARREN_KEEP_RAY_LOGS"):
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(RAY), "start", *args, "--block", "--disable-usage-stats"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _node_args() -> list[str]:
    """Ports of one node, all free ones (two nodes share this machine)."""
    return [
        "--node-ip-address=127.0.0.1",
        "--num-cpus=2",
        f"--node-manager-port={free_port()}",
        f"--object-manager-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
        f"--metrics-export-port={free_port()}",
        "--object-store-memory=100000000",
    ]


@contextlib.contextmanager
def local_ray_cluster(nodes: int = 2) -> Iterator[LocalRayCluster]:
    """A head and `nodes - 1` more nodes, stopped (and their temp directory removed) on exit,
    whatever happens. The nodes may still be joining when this yields: a driver waits."""
    temp_dir = Path(tempfile.mkdtemp(prefix="warren-ray-", dir="/var/tmp"))
    token = secrets.token_hex(32)
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "RAY_USAGE_STATS_ENABLED": "0",
        # The nodes' snapshot caches and views (workers/remote/actor.py), removed with the rest.
        "WARREN_RAY_CACHE": str(temp_dir / "cache"),
        **auth,
    }
    port = free_port()
    cluster = LocalRayCluster(f"127.0.0.1:{port}", token, auth, temp_dir)
    try:
        cluster.processes.append(
            _start(
                [
                    "--head",
                    f"--port={port}",
                    f"--temp-dir={temp_dir}",
                    "--include-dashboard=false",
                    *_node_args(),
                ],
                env,
                temp_dir / "head.log",
            )
        )
        _wait_port(port, cluster.processes[0], temp_dir / "head.log")
        for i in range(1, nodes):
            cluster.processes.append(
                _start(
                    [f"--address={cluster.address}", *_node_args()],
                    env,
                    temp_dir / f"node{i}.log",
                )
            )
        yield cluster
    finally:
        cluster.stop()


def _wait_port(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the Ray head exited: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"the Ray head did not listen within 60 s: {log.read_text()[-2000:]}")
