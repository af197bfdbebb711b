"""`warren server` end to end: the real thin client and a real forked session process.

Most tests run the server with the probe entry (`probe.py`, the server's seam), which reports
what the session process was given; `test_killed_server_*` runs real Warren sessions against
the fake Messages API."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.kit.tty import Terminal
from tests.orchestrator.server.conftest import ROOT, WARREN, Server, servers_in

ODD = "dä ö\n\t'$(x)\" \\ 🦊"
"""Text that a careless pass through JSON, a shell or an encoding would change."""


def _client(server: Server, args: list[str], **options: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*WARREN, *args],
        env=options.pop("env", server.env),  # type: ignore[arg-type]
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **options,  # type: ignore[call-overload]
    )


def test_argv_env_cwd_fds_round_trip(server: Server, tmp_path: Path) -> None:
    """The session process gets exactly the client's argv, cwd, environment, umask, stdin,
    stdout and stderr, and its exit code comes back; nothing heavy is imported by the
    client on the way (standard library only)."""
    server.start()
    env = {**server.env, "ODD_VALUE": ODD}
    where = tmp_path / "a dir ü"
    where.mkdir()
    client = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "orchestrator.cli", "echo", "7", ODD],
        env=env,
        cwd=where,
        input=ODD,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.umask(0o027),
    )
    assert client.returncode == 7, client.stderr
    report = json.loads(client.stdout)
    assert report["argv"] == ["echo", "7", ODD]
    assert report["sys_argv"] == ["warren", "echo", "7", ODD]
    assert report["cwd"] == str(where)
    assert report["env"] == env
    assert report["umask"] == 0o027
    assert report["stdin"] == ODD
    assert report["ttys"] == [None, None, None]
    stderr = client.stderr.splitlines()
    assert "this went to stderr" in stderr
    imported = {line.split("|")[-1].strip() for line in stderr if line.startswith("import time:")}
    ours = {name for name in imported if name.split(".")[0] in ("orchestrator", "workers")}
    assert ours == {"orchestrator", "orchestrator.cli", "orchestrator.cli.client",
                    "orchestrator.cli.commands"}, ours  # fmt: skip
    third_party = {"trio", "pydantic", "anthropic", "httpx", "structlog", "rich"}
    assert not {name.split(".")[0] for name in imported} & third_party


def test_session_sees_its_own_terminal(server: Server, tmp_path: Path) -> None:
    """At a terminal the session process's 0/1/2 are that terminal, and it gets the
    terminal's path for permission asks."""
    server.start()
    terminal = Terminal.start(
        [*WARREN, "echo", "0"], env=server.env, cwd=tmp_path, socket_dir=tmp_path, width=400
    )
    try:
        assert terminal.wait_exit() == 0
        pane_tty = terminal._tmux("display-message", "-p", "-t", terminal.name, "#{pane_tty}")
        screen = terminal.screen().replace("\n", "")
        report = json.loads(screen[screen.index("{") : screen.rindex("}") + 1])
    finally:
        terminal.close()
    assert report["ttys"] == [pane_tty.strip()] * 3
    assert report["terminal"] == pane_tty.strip()


def _reap(process: subprocess.Popen[str]) -> None:
    """A client a failed assertion left running is not left to the next tests (a zombie
    child of this test process, or its pipes closed by the garbage collector)."""
    if process.poll() is None:
        process.kill()
    process.communicate(timeout=60)


def _line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    return process.stdout.readline().strip()


def test_signals_reach_the_session(server: Server, tmp_path: Path) -> None:
    """INT and WINCH are passed on; TERM ends the session with 143, which the client
    returns; the client's death reads as SIGHUP in the session."""
    server.start()
    log = tmp_path / "signals.log"
    client = _client(server, ["signals", str(log)])
    try:
        assert _line(client) == "ready"
        for sig in (signal.SIGWINCH, signal.SIGINT):
            client.send_signal(sig)
            assert _line(client) == f"got {int(sig)}"
        client.send_signal(signal.SIGTERM)
        assert _line(client) == "got 15"
        client.communicate(timeout=60)
        assert client.returncode == 143
    finally:
        _reap(client)

    log.unlink()
    orphaned = _client(server, ["signals", str(log)])
    try:
        assert _line(orphaned) == "ready"
    finally:
        orphaned.kill()
        orphaned.communicate(timeout=60)
    deadline = time.monotonic() + 60
    while not (log.exists() and "got 1" in log.read_text()):
        assert time.monotonic() < deadline, "the session never got SIGHUP"
        time.sleep(0.05)
    deadline = time.monotonic() + 60
    while server.sessions():
        assert time.monotonic() < deadline, "the orphaned session did not end"
        time.sleep(0.05)


def test_two_clients_get_two_isolated_sessions(server: Server) -> None:
    """Two clients at once: two session processes, running together, each with its own
    environment and pipes."""
    server.start()
    first = _client(server, ["wait"], env={**server.env, "MARK": "one"})
    second = _client(server, ["wait"], env={**server.env, "MARK": "two"})
    one, two = json.loads(_line(first)), json.loads(_line(second))
    assert (one["mark"], two["mark"]) == ("one", "two")
    assert one["pid"] != two["pid"]
    assert {p.pid for p in server.sessions()} == {one["pid"], two["pid"]}
    assert server.process is not None
    assert server.process.pid not in (one["pid"], two["pid"])
    out_two, _ = second.communicate("go\n", timeout=60)
    out_one, _ = first.communicate("go\n", timeout=60)
    assert (out_one.strip(), out_two.strip()) == ("done one", "done two")
    assert first.returncode == second.returncode == 0


def test_stale_socket_is_replaced(server: Server, tmp_path: Path) -> None:
    """A socket file nobody listens on: a client runs in-process (no hang, no error), and
    a new server replaces the file."""
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(server.directory / "server.sock"))
    stale.close()
    in_process = subprocess.run(
        [*WARREN, "server", "status"], env=server.env, capture_output=True, text=True
    )
    assert in_process.returncode == 3 and "no server running" in in_process.stdout
    server.start()
    client = subprocess.run(
        [*WARREN, "echo", "0"], env=server.env, capture_output=True, text=True, timeout=120
    )
    assert client.returncode == 0, client.stderr  # the probe ran: in-process it is a usage error
    assert json.loads(client.stdout)["argv"] == ["echo", "0"]


def test_an_idle_server_exits(server: Server) -> None:
    """`--idle-timeout`: a running session keeps the server up however long it takes; once
    none has run for that long, the server exits and removes its socket."""
    server.start(idle_timeout=1.0)
    assert server.process is not None
    # A connection that has not spoken yet is a session process already: it holds the
    # server up while the client (slow to start on a busy machine) comes.
    holder = socket.socket(socket.AF_UNIX)
    holder.connect(str(server.directory / "server.sock"))
    client = _client(server, ["wait"])
    assert json.loads(_line(client))["mark"] is None
    holder.close()
    until = time.monotonic() + 2.0  # two timeouts, with a session running
    while time.monotonic() < until:
        assert server.process.poll() is None, "the server left while a session ran"
        time.sleep(0.05)
    out, _ = client.communicate("go\n", timeout=60)
    assert (client.returncode, out.strip()) == (0, "done None")
    assert server.process.wait(timeout=60) == 0
    assert not (server.directory / "server.sock").exists()


def test_a_server_of_another_version_is_replaced(server: Server, tmp_path: Path) -> None:
    """A client finds a server running other code (here: a copy of Warren's, other file
    times): the server does not take the run, it exits and removes its socket, and the run
    goes on in-process."""
    old = tmp_path / "old"
    for package in ("orchestrator", "workers", "sandbox", "policies"):
        shutil.copytree(
            ROOT / package,
            old / package,
            copy_function=shutil.copy,  # new times: another `code_version`
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    server.start(code=f"{old}:{ROOT}")
    assert server.process is not None
    status = subprocess.run(
        [*WARREN, "server", "status"], env=server.env, capture_output=True, text=True
    )
    assert "(another version)" in status.stdout, status
    run = subprocess.run(
        [*WARREN, "-p", "hi", "--model", "scripted:/nonexistent.json"],
        env=server.env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "cannot read the script" in run.stderr  # it ran in-process instead
    assert server.process.wait(timeout=60) == 0
    assert not (server.directory / "server.sock").exists()


def _as_nobody() -> None:
    os.setgid(65534)
    os.setuid(65534)


def test_another_uid_is_refused(server: Server, tmp_path: Path) -> None:
    """A client of another uid gets nothing even when it can reach the socket (SO_PEERCRED),
    and a server directory owned by another uid is never used."""
    if os.getuid() != 0:
        pytest.skip("needs root to act as another uid (CI runs as root)")
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 that uid 65534 may run")
    server.start()
    os.chmod(server.directory, 0o755)
    os.chmod(server.directory / "server.sock", 0o777)
    attempt = subprocess.run(
        [python, "-c", (
            "import socket, sys\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "s.connect(sys.argv[1])\n"
            "try:\n"
            "    s.sendall(b'{\"op\": \"status\"}\\n')\n"
            "    print(repr(s.recv(100)))\n"
            "except (ConnectionResetError, BrokenPipeError):\n"
            "    print('reset')\n"
        ), str(server.directory / "server.sock")],
        capture_output=True, text=True, timeout=60, preexec_fn=_as_nobody,
    )  # fmt: skip
    assert attempt.returncode == 0, attempt.stderr
    assert attempt.stdout.strip() in ("b''", "reset")  # closed without a word
    assert server.sessions() == []
    os.chmod(server.directory, 0o700)
    os.chown(server.directory, 65534, 65534)
    refused = subprocess.run(
        [*WARREN, "-p", "hi", "--model", "scripted:/nonexistent.json"],
        env=server.env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    os.chown(server.directory, 0, 0)
    assert f"not using the server: {server.directory} belongs to uid 65534" in refused.stderr
    assert "cannot read the script" in refused.stderr  # it ran in-process instead
    assert server.sessions() == []


def test_auto_start_only_from_an_interactive_terminal(server: Server, tmp_path: Path) -> None:
    """`maybe_start_server` (what an in-process run calls) starts a server only for an
    interactive session at a terminal without CI; `warren server status|stop` see and stop
    it. Spawning is synchronous, so "nothing started" is checked right after the call."""
    call = (
        "import sys; from orchestrator.cli.client import maybe_start_server as m; m(sys.argv[1:])"
    )
    env = {k: v for k, v in server.env.items() if k != "CI"}
    for extra_env, args in (({"CI": "true"}, []), ({}, ["-p", "hi"])):
        terminal = Terminal.start(
            [sys.executable, "-c", call, *args], env={**env, **extra_env}, cwd=tmp_path,
            socket_dir=tmp_path,
        )  # fmt: skip
        try:
            assert terminal.wait_exit() == 0
        finally:
            terminal.close()
        assert servers_in(server.directory) == []
    piped = subprocess.run([sys.executable, "-c", call], env=env, capture_output=True, timeout=60)
    assert piped.returncode == 0 and servers_in(server.directory) == []

    terminal = Terminal.start(
        [sys.executable, "-c", call], env=env, cwd=tmp_path, socket_dir=tmp_path
    )
    try:
        assert terminal.wait_exit() == 0
    finally:
        terminal.close()
    assert len(servers_in(server.directory)) == 1
    deadline = time.monotonic() + 120
    while not server.answers():
        assert time.monotonic() < deadline, "the auto-started server never answered"
        time.sleep(0.05)
    status = subprocess.run([*WARREN, "server", "status"], env=env, capture_output=True, text=True)
    assert status.returncode == 0 and "(current)" in status.stdout, status
    stop = subprocess.run([*WARREN, "server", "stop"], env=env, capture_output=True, text=True)
    assert stop.returncode == 0 and "stopped" in stop.stdout, stop
    assert servers_in(server.directory) == []
