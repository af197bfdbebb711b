"""The escape suite's harness: an arena (a workspace, a directory outside it, a fake home with
secrets, a vault), the script runner, and the host-side checks.

Each attempt runs a small script in a real sandbox and then asserts *on the host* that
nothing happened: the file outside is absent, the secret never reached the output, the
listener saw no connection, the process is gone. Every Python attempt script first does a
control action that must succeed (a write inside a writable workspace, a read in a read-only
one) so an attempt cannot pass because the sandbox never ran.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psutil
import pytest
import trio

from sandbox.host import SandboxHost
from sandbox.run import RunAs, SandboxResult, run_sandboxed
from sandbox.spec import Bind, Limits, Mode, SandboxSpec, WorkspaceRoot
from tests.sandbox.conftest import ATTEMPT_PYTHON, chown_tree

Who = Literal["host", "unpriv"]

PRELUDE = r"""
import json, os, sys
A = json.loads(sys.argv[1])
R = {}
def t(name, fn, *args, **kwargs):
    try:
        value = fn(*args, **kwargs)
    except BaseException as exc:
        R[name] = "err:%s:%s" % (type(exc).__name__, exc)
    else:
        R[name] = "ok" if value is None else "ok:" + str(value)[:400]
def w(path, data="pwned"):
    with open(path, "w") as f:
        f.write(data)
def app(path, data="pwned"):
    with open(path, "a") as f:
        f.write(data)
def r(path):
    with open(path, "rb") as f:
        return f.read().decode(errors="replace")
if A["mode"] == "rw":
    t("control", w, os.path.join(A["ws"], ".control-" + A["token"]), "control")
else:
    t("control", r, os.path.join(A["ws"], "file.txt"))
def done():
    print("\nRESULT:" + json.dumps(R), flush=True)
"""

ORIGINAL = "original content\n"


@dataclass
class Outcome:
    result: SandboxResult
    report: dict[str, str]

    @property
    def output(self) -> bytes:
        return self.result.stdout + self.result.stderr

    def debug(self) -> str:
        return (
            f"exit={self.result.exit_code} limit={self.result.killed_by_limit} "
            f"report={self.report} stderr={self.result.stderr[-2000:]!r}"
        )

    def refused(self, name: str) -> bool:
        return self.report.get(name, "").startswith("err:")

    def assert_ran(self) -> None:
        assert self.report.get("control", "").startswith("ok"), self.debug()

    def assert_refused(self, *names: str) -> None:
        self.assert_ran()
        for name in names:
            assert self.refused(name), f"{name} was not refused: {self.debug()}"


@dataclass
class Arena:
    who: Who
    base: Path
    host: SandboxHost
    run_as: RunAs | None
    monkeypatch: pytest.MonkeyPatch
    token: str
    closers: list[Callable[[], None]] = field(default_factory=list)

    @property
    def ws(self) -> Path:
        return self.base / "ws"

    @property
    def outside(self) -> Path:
        return self.base / "outside"

    @property
    def home(self) -> Path:
        return self.base / "home"

    @property
    def vault(self) -> Path:
        return self.base / "vault"

    def prepare(self) -> None:
        for directory in (self.ws, self.outside, self.home, self.vault, self.ws / "sub"):
            directory.mkdir(parents=True, exist_ok=True)
        (self.ws / "file.txt").write_text(ORIGINAL)
        (self.outside / "target.txt").write_text(ORIGINAL)
        (self.home / "notes.txt").write_text("not a secret\n")
        (self.vault / "other.txt").write_text("not a secret either\n")
        self.own()

    def own(self, path: Path | None = None) -> None:
        chown_tree(path or self.base, self.run_as)

    def spec(
        self,
        mode: Mode = "rw",
        *,
        limits: Limits | None = None,
        workspace: Path | None = None,
        extra_binds: Sequence[Bind] = (),
        allow_unix_sockets: bool = False,
        hide_home: bool = True,
    ) -> SandboxSpec:
        return SandboxSpec(
            workspaces=(WorkspaceRoot(path=workspace or self.ws, mode=mode),),
            extra_binds=tuple(extra_binds),
            home=self.home,
            hide_home=hide_home,
            allow_unix_sockets=allow_unix_sockets,
            limits=limits or Limits(wall_time_s=30.0),
        )

    def args(self, mode: Mode, extra: dict[str, Any] | None = None) -> str:
        return json.dumps(
            {
                "ws": str(self.ws),
                "outside": str(self.outside),
                "home": str(self.home),
                "vault": str(self.vault),
                "token": self.token,
                "mode": mode,
                "test_pid": os.getpid(),
                **(extra or {}),
            }
        )

    async def py(
        self,
        script: str,
        *,
        mode: Mode = "rw",
        spec: SandboxSpec | None = None,
        stdin: bytes | int | None = None,
        extra: dict[str, Any] | None = None,
        cwd: Path | None = None,
    ) -> Outcome:
        source = PRELUDE + script + "\ndone()\n"
        argv = [str(ATTEMPT_PYTHON), "-I", "-S", "-c", source, self.args(mode, extra)]
        return await self._run(argv, spec or self.spec(mode), stdin, cwd)

    async def sh(
        self, script: str, *, mode: Mode = "rw", spec: SandboxSpec | None = None
    ) -> Outcome:
        argv = [
            "/bin/sh",
            "-c",
            script,
            "sh",
            str(self.ws),
            str(self.outside),
            str(self.home),
            self.token,
        ]
        return await self._run(argv, spec or self.spec(mode), None, None)

    async def _run(
        self, argv: list[str], spec: SandboxSpec, stdin: bytes | int | None, cwd: Path | None
    ) -> Outcome:
        result = await run_sandboxed(
            spec, argv, host=self.host, run_as=self.run_as, stdin=stdin, cwd=cwd
        )
        report: dict[str, str] = {}
        for line in result.stdout.decode(errors="replace").splitlines():
            if line.startswith("RESULT:"):
                report = json.loads(line.removeprefix("RESULT:"))
        return Outcome(result=result, report=report)

    # -- host-side helpers ---------------------------------------------------------------

    def tcp_listener(self, address: str = "127.0.0.1") -> socket.socket:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.bind((address, 0))
        sock.listen(16)
        self.closers.append(sock.close)
        return sock

    def udp_listener(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        self.closers.append(sock.close)
        return sock

    def unix_listener(
        self, path: Path | str, kind: socket.SocketKind = socket.SOCK_STREAM
    ) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, kind)
        sock.bind(str(path))
        if isinstance(path, Path):
            os.chmod(path, 0o777)  # the unprivileged account could connect without a sandbox
        if kind == socket.SOCK_STREAM:
            sock.listen(16)
        self.closers.append(sock.close)
        return sock

    def close(self) -> None:
        for closer in reversed(self.closers):
            closer()


def nothing_pending(sock: socket.socket) -> bool:
    """True when no connection or datagram reached this host socket."""
    sock.setblocking(False)
    try:
        if sock.type == socket.SOCK_DGRAM:
            sock.recv(65536)
        else:
            conn, _ = sock.accept()
            conn.close()
    except BlockingIOError:
        return True
    return False


def processes_with(token: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if any(token in part for part in cmdline):
            found.append(proc)
    return found


async def assert_gone(token: str, within_s: float = 5.0) -> None:
    """No process mentioning `token` survives. The pid namespace dies with bwrap, but the
    kernel reaps its members asynchronously, so allow a short, bounded settling time."""
    deadline = time.monotonic() + within_s
    while processes_with(token):
        if time.monotonic() > deadline:
            raise AssertionError(f"processes outlived the sandbox: {processes_with(token)}")
        await trio.sleep(0.05)


def unchanged(path: Path, content: str = ORIGINAL) -> bool:
    return path.is_file() and not path.is_symlink() and path.read_text() == content
