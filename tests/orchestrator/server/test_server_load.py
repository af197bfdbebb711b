"""Many sessions from one server leave it as they found them (issue 15: "16 concurrent
sessions from one server: all complete; no fd, process or memory leak after 200 sessions";
tests/bench/bench_server.py runs those with real Warren sessions). Here, lean, with the probe
entry: four sessions at once, then three one after another."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.orchestrator.server.conftest import WARREN, Server


def _descriptors(pid: int) -> dict[int, str]:
    found = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            found[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            pass
    return found


def _beyond_stdio(descriptors: dict[int, str]) -> set[str]:
    return {target for fd, target in descriptors.items() if fd > 2}


def _wait(server: Server, mark: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*WARREN, "wait"], env={**server.env, "MARK": mark}, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def test_sessions_leave_the_server_as_they_found_it(server: Server) -> None:
    pid = server.start()
    before = _descriptors(pid)
    waiting = [_wait(server, str(i)) for i in range(4)]
    for client in waiting:  # all four run at once
        assert client.stdout is not None
        assert json.loads(client.stdout.readline())["mark"] is not None
    assert len(server.sessions()) == 4
    for i, client in enumerate(waiting):
        out, err = client.communicate("go\n", timeout=60)
        assert (client.returncode, out.strip()) == (0, f"done {i}"), err
    reports = []
    for code in range(3):
        done = subprocess.run(
            [*WARREN, "echo", str(code)], env=server.env, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert done.returncode == code, done.stderr
        reports.append(json.loads(done.stdout))
    deadline = time.monotonic() + 30
    while server.sessions():  # each reaped (a zombie is a child too)
        assert time.monotonic() < deadline, f"sessions not reaped: {server.sessions()}"
        time.sleep(0.02)
    # The server's end of the last `sessions()` query may still be closing: a moment, not more.
    deadline = time.monotonic() + 5
    while _descriptors(pid) != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _descriptors(pid) == before
    server_own = _beyond_stdio(before)  # the lock, the listener, the wake-up pipe
    for report in reports:
        held = _beyond_stdio({int(fd): target for fd, target in report["fds"].items()})
        assert held & server_own == set(), report["fds"]


def test_a_fork_that_fails_refuses_the_client_and_keeps_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of processes (EAGAIN) or memory, the server cannot fork a session: the client is
    told so (it then runs the session itself, as with any refusal) and the server goes on,
    with nothing of that client kept."""
    from orchestrator.cli.client import ServerLink
    from orchestrator.cli.warm import server as srv

    path = str(tmp_path / "s.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen()
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(path)

        def no_fork() -> int:
            raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))

        monkeypatch.setattr(srv.os, "fork", no_fork)
        state = srv._ServerState(version="v", idle_timeout=60.0)
        srv._accept(listener, state, (), lambda argv, terminal, floor: 0)
        message, _ = ServerLink(client).receive()
        client.close()
    assert message is not None and "could not fork" in message["refused"]
    assert state.sessions == set() and state.served == 0


def test_a_refused_run_says_why_in_one_line_and_runs_here(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A session process that cannot take the client's descriptors or cwd refuses: the
    client says so (the server's reason, escaped) and runs the session itself."""
    from orchestrator.cli import client as cli_client

    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(b'{"refused": "no such directory \\u001b[31m/gone"}\n')
        with pytest.raises(cli_client._NotTaken) as taken:
            cli_client._run_session(cli_client.ServerLink(ours), ["-p", "hi"])
        request, fds = cli_client.ServerLink(theirs).receive(max_fds=4)
        for fd in fds:
            os.close(fd)
    assert not taken.value.replaced and request is not None and request["argv"] == ["-p", "hi"]
    err = capsys.readouterr().err
    assert err == (
        "warren: the Warren server could not take this run (no such directory ?[31m/gone); "
        "it runs here\n"
    )
