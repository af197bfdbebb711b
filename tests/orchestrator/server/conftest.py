"""A private server per test: its own directory (WARREN_SERVER_DIR, short enough for a Unix
socket path), started as `warren server run` in the background, and gone afterwards with
every session process it forked (checked with psutil)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from orchestrator.cli.client import server_env
from tests.kit.server_processes import servers_in

ROOT = Path(__file__).resolve().parents[3]
WARREN = [sys.executable, "-m", "orchestrator.cli"]
PROBE = "tests.orchestrator.server.probe:session"


@dataclass
class Server:
    directory: Path
    env: dict[str, str]
    """The environment of a client of this server (no WARREN_NO_SERVER)."""
    process: subprocess.Popen[bytes] | None = None

    def start(
        self, *, entry: str | None = PROBE, idle_timeout: float = 600, code: str | None = None
    ) -> int:
        """Start the server and wait until it answers; its pid. `code`: the PYTHONPATH it
        runs with (a copy of Warren's code is another version)."""
        extra = ["--entry", entry] if entry else []
        env = server_env(self.env)  # what `warren server start` gives it
        if code is not None:
            env["PYTHONPATH"] = code
        self.process = subprocess.Popen(
            [*WARREN, "server", "run", "--idle-timeout", str(idle_timeout), *extra],
            env=env,
            cwd="/",  # as `warren server start` runs it (and no checkout first on sys.path)
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while not self.answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                assert self.process.stderr is not None
                raise AssertionError(f"the server did not start: {self.process.stderr.read()!r}")
            time.sleep(0.02)
        return self.process.pid

    def answers(self) -> bool:
        """A server listens on the socket (a stale file does not count)."""
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(str(self.directory / "server.sock"))
            probe.sendall(b'{"op": "status"}\n')
            return probe.recv(1) != b""
        except OSError:
            return False
        finally:
            probe.close()

    def status(self) -> dict[str, object]:
        """The server's answer to `status` (`warren server status` prints it)."""
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(str(self.directory / "server.sock"))
            probe.sendall(b'{"op": "status"}\n')
            answer = probe.makefile("rb").readline()
        finally:
            probe.close()
        status: dict[str, object] = json.loads(answer)["status"]
        return status

    def sessions(self) -> list[psutil.Process]:
        """The server's session processes (not its spare tool hosts: orchestrator/cli/
        spares.py)."""
        found = []
        for process in self.children():
            with contextlib.suppress(psutil.Error):
                if process.name() != "bwrap":
                    found.append(process)
        return found

    def children(self) -> list[psutil.Process]:
        assert self.process is not None
        try:
            return psutil.Process(self.process.pid).children()
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        if self.process is None:
            return
        family = self.children()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for process in family:  # sessions outlive a stopped server; a test's must not
            try:
                for child in [*process.children(recursive=True), process]:
                    child.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(family, timeout=30)
        assert self.process.stderr is not None
        self.process.stderr.close()


def client_env(directory: Path) -> dict[str, str]:
    lifted = ("WARREN_NO_SERVER", "PYTEST_CURRENT_TEST")
    env = {k: v for k, v in os.environ.items() if k not in lifted}
    return {**env, "WARREN_SERVER_DIR": str(directory), "PYTHONPATH": str(ROOT)}


@pytest.fixture
def server() -> Iterator[Server]:
    directory = Path(tempfile.mkdtemp(prefix="wsrv", dir="/tmp"))
    instance = Server(directory, client_env(directory))
    try:
        yield instance
    finally:
        instance.stop()
        left = servers_in(directory)
        for process in left:
            process.kill()
        shutil.rmtree(directory, ignore_errors=True)
        assert not left, f"processes of the test's server were left running: {left}"
