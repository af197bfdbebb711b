"""The thin client on `warren`'s start-up path: hand a run to the per-user server, if one is
running, and become a remote control for the session process it forks.

Standard library only (pinned by tests/orchestrator/server/test_client_imports.py): a warm
launch must not pay for trio, pydantic or the SDK, which the server has already imported.

The client connects to `server.sock` in the server directory (`server_dir`), checks with
SO_PEERCRED that the server runs as the same user, and sends one request line (JSON: argv,
cwd, environment, umask) with its stdin, stdout and stderr, and the controlling terminal
when it has one, attached as SCM_RIGHTS. The server forks a session process which installs
those descriptors as its own 0/1/2 and runs the in-process code path, writing straight to
the user's terminal or pipes. The client then only forwards signals (INT, TERM, HUP, WINCH)
as lines and waits for the session's exit code. Its own death closes the socket, which the
session reads as SIGHUP (a closed terminal).

Whenever the server cannot take the run (none running, `WARREN_NO_SERVER=1`, `--no-server`,
another version, a directory that is not safely ours) `run_through_server` returns None and
`warren` runs in-process as it always has; from an interactive terminal it also starts a
server in the background for next time (`maybe_start_server`).
"""

from __future__ import annotations

# The C halves of `json`, `socket` and `signal`: the Python modules import `enum`, `re` (and
# compile its patterns) and `selectors`, which cost the client more than everything else it
# does on a warm launch (tests/orchestrator/server/test_client_imports.py). Nor `array` or
# `collections.abc`: each imports `collections` (with `operator`, `keyword`, `reprlib`), 2-3 ms
# of CPU on every launch; `_collections_abc` is loaded by `os` at start-up anyway.
import _collections_abc
import _json
import _socket
import os
import stat
import sys

TYPE_CHECKING = False  # `typing` itself costs a warm launch milliseconds
if TYPE_CHECKING:
    import signal as _signal  # `_signal` has no stubs: `signal` re-exports all of it
    from collections.abc import Iterator, Mapping, Sequence
    from pathlib import Path  # `pathlib` too (with `re`, `fnmatch`, `urllib.parse`)
    from typing import Any, TypeVar

    _Dir = TypeVar("_Dir", str, Path)
else:
    import _signal

__all__ = [
    "DIR_ENV",
    "OFF_ENV",
    "SOCKET_NAME",
    "ServerDirRefused",
    "ServerLink",
    "code_version",
    "connect",
    "maybe_start_server",
    "run_through_server",
    "server_dir",
    "server_env",
]

DIR_ENV = "WARREN_SERVER_DIR"
"""Overrides the server directory (tests use a private one)."""
OFF_ENV = "WARREN_NO_SERVER"
"""`1` (or any value but `0` and empty): never use or start a server."""
IDLE_ENV = "WARREN_SERVER_IDLE_TIMEOUT"
"""Seconds an auto-started server waits without sessions before it exits (default 1800)."""
SOCKET_NAME = "server.sock"
FORWARDED = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGWINCH)
"""Signals the client passes on to the session process."""
EXIT_SERVER_GONE = 128 + _signal.SIGHUP
"""The session process vanished without an exit code: cut off as by a hangup (129)."""
_PACKAGES = ("orchestrator", "workers", "sandbox", "policies")
_SERVER_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TMPDIR", "VIRTUAL_ENV", "TZ",
               "SSL_CERT_FILE", "SSL_CERT_DIR")  # fmt: skip
"""The server's environment (with `_SERVER_ENV_PREFIXES`); the CA settings are for the TLS
context it makes for its sessions (`orchestrator.model.tls`)."""
_SERVER_ENV_PREFIXES = ("LC_", "PYTHON", "XDG_", "WARREN_")
_INT_SIZE = 4
"""Bytes of a C `int`, a descriptor in an SCM_RIGHTS message (`array.array("i").itemsize` on
every platform Warren runs on)."""


class ServerDirRefused(Exception):
    """The server directory is not a 0700 directory of this user: never used."""


def server_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Where the server's socket lives: `$WARREN_SERVER_DIR`, else `$XDG_RUNTIME_DIR/warren`,
    else `warren-UID` under the system temp directory (`TMPDIR`, `TEMP`, `TMP`, `/tmp`, as
    `tempfile.gettempdir` picks; that module is too slow to import here)."""
    from pathlib import Path

    return Path(_server_dir(environ))


def _server_dir(environ: Mapping[str, str]) -> str:
    """`server_dir` as a string: the warm path does without `pathlib`."""
    if environ.get(DIR_ENV):
        return environ[DIR_ENV]
    if environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(environ["XDG_RUNTIME_DIR"], "warren")
    for name in ("TMPDIR", "TEMP", "TMP"):
        if environ.get(name) and os.path.isdir(environ[name]):
            return os.path.join(environ[name], f"warren-{os.getuid()}")
    return f"/tmp/warren-{os.getuid()}"


def checked_dir(directory: _Dir, *, create: bool = False) -> _Dir:
    """`directory` when it is a real directory owned by this user with no access for anyone
    else (made so when `create`). **Errors:** `ServerDirRefused` otherwise (someone else's
    directory in a shared temp directory could hold a socket that impersonates the server);
    `FileNotFoundError` when it does not exist and not `create`."""
    if create:
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise ServerDirRefused(f"{directory} is not a directory")
    if info.st_uid != os.getuid():
        raise ServerDirRefused(
            f"{directory} belongs to uid {info.st_uid}, not to you (uid {os.getuid()}); "
            f"remove it or set {DIR_ENV}"
        )
    if info.st_mode & 0o077:
        raise ServerDirRefused(
            f"{directory} is open to other users (mode {stat.S_IMODE(info.st_mode):o}); "
            f"chmod 700 it"
        )
    return directory


def code_version() -> str:
    """What a server must match to take a run: the interpreter and Warren's code as it is on
    disk now (newest source file and file count), so an upgrade or an edit in a checkout
    replaces a server that still runs the old code."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    newest, count = 0, 0
    for package in _PACKAGES:
        for entry in _py_files(os.path.join(root, package)):
            newest = max(newest, entry.stat().st_mtime_ns)
            count += 1
    return f"{sys.executable}|{sys.version.split()[0]}|{count}|{newest}"


def _py_files(directory: str) -> Iterator[os.DirEntry[str]]:
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            if entry.name not in ("__pycache__", "sample"):
                yield from _py_files(entry.path)
        elif entry.name.endswith(".py"):
            yield entry


def _peer_uid(sock: _socket.socket) -> int:
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)  # pid, uid, gid
    return int.from_bytes(creds[4:8], sys.byteorder, signed=True)


class ServerLink:
    """One connection to the server: JSON lines both ways, descriptors with the first.
    `sock`: a `socket.socket`, or the client's plain `_socket.socket`."""

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self._buffer = b""

    def send(self, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
        data = _encode(message).encode() + b"\n"
        if fds:  # as `socket.send_fds`
            rights = b"".join(fd.to_bytes(_INT_SIZE, sys.byteorder, signed=True) for fd in fds)
            sent = self.sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
            data = data[sent:]
        self.sock.sendall(data)

    def receive(self, *, max_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
        """The next message (None at the end of the stream) and the descriptors that came
        with its bytes."""
        fds: list[int] = []
        while b"\n" not in self._buffer:
            if max_fds:
                chunk, got = _recv_fds(self.sock, max_fds)
                fds.extend(got)
            else:
                chunk = self.sock.recv(65536)
            if not chunk:
                return None, fds
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        message = _decode(line)
        if not isinstance(message, dict):
            raise ValueError("a server message is a JSON object")
        return message, fds

    def buffered(self) -> bool:
        """A whole message is already read (the next `receive` takes no bytes)."""
        return b"\n" in self._buffer

    def close(self) -> None:
        self.sock.close()


def _recv_fds(sock: _socket.socket, max_fds: int) -> tuple[bytes, list[int]]:
    """As `socket.recv_fds`: bytes, and the descriptors that came with them."""
    fds: list[int] = []
    data, ancillary, _, _ = sock.recvmsg(65536, _socket.CMSG_LEN(max_fds * _INT_SIZE))
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            whole = len(payload) - len(payload) % _INT_SIZE
            fds += (
                int.from_bytes(payload[at : at + _INT_SIZE], sys.byteorder, signed=True)
                for at in range(0, whole, _INT_SIZE)
            )
    return data, fds


def _encode(value: object) -> str:
    """`json.dumps(value)` for what the link carries (objects with string keys, lists,
    strings, numbers, booleans, null), ASCII-only as `json.dumps` makes it."""
    if isinstance(value, str):
        return _json.encode_basestring_ascii(value)
    if value is None or isinstance(value, bool):
        return "null" if value is None else "true" if value else "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return "NaN" if value != value else "Infinity" if value > 0 else "-Infinity"
        return float.__repr__(value)
    if isinstance(value, _collections_abc.Mapping):
        items = []
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"a link message's keys are strings, not {type(key).__name__}")
            items.append(f"{_json.encode_basestring_ascii(key)}: {_encode(item)}")
        return "{" + ", ".join(items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_encode(item) for item in value) + "]"
    raise TypeError(f"a link message cannot carry {type(value).__name__}")


class _JsonGrammar:
    """What `_json.make_scanner` reads: the defaults of `json.JSONDecoder`."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    array_hook = None  # read from Python 3.15 on
    parse_float = float
    parse_int = int
    parse_constant = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}.get


_scan = _json.make_scanner(_JsonGrammar())  # type: ignore[arg-type]


def _decode(line: bytes) -> object:
    """`json.loads(line)`. **Errors:** `ValueError` (as `json.loads`)."""
    text = line.decode().strip(" \t\n\r")
    try:
        value, end = _scan(text, 0)
    except StopIteration as exc:
        raise ValueError(f"not JSON at character {exc.value}") from None
    if end != len(text):
        raise ValueError(f"extra data after JSON at character {end}")
    return value


def connect(directory: str | Path) -> ServerLink | None:
    """A link to the server in `directory`, or None when none answers there (no socket, a
    stale socket file, or a socket of another user)."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(os.path.join(directory, SOCKET_NAME))
        if _peer_uid(sock) != os.getuid():
            raise ConnectionRefusedError("the server runs as another user")
    except OSError:
        sock.close()
        return None
    return ServerLink(sock)


def _opted_out(argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    return "--no-server" in argv or environ.get(OFF_ENV, "") not in ("", "0")


def _say(line: str) -> None:
    try:
        print(f"warren: {line}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def run_through_server(argv: Sequence[str]) -> int | None:
    """Run `warren ARGV` in a session process of the running server and return its exit
    code; None when there is no server to take it (run in-process then)."""
    if _opted_out(argv, os.environ):
        return None
    try:
        directory = checked_dir(_server_dir(os.environ))
    except FileNotFoundError:
        maybe_start_server(argv)
        return None
    except ServerDirRefused as exc:
        _say(f"not using the server: {exc}")
        return None
    except OSError:
        return None
    link = connect(directory)
    if link is None:
        maybe_start_server(argv)
        return None
    try:
        return _run_session(link, argv)
    except _NotTaken as exc:
        if exc.replaced:
            maybe_start_server(argv)  # the old server is on its way out
        return None
    finally:
        link.close()


class _NotTaken(Exception):
    """The server did not take the run: another version (`replaced`: it is on its way out),
    or a session process that could not become the client's (say, its cwd is gone)."""

    def __init__(self, *, replaced: bool) -> None:
        super().__init__()
        self.replaced = replaced


def _terminal_fd() -> int | None:
    try:
        return os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None


def _run_session(link: ServerLink, argv: Sequence[str]) -> int:
    umask = os.umask(0o022)
    os.umask(umask)
    try:
        cwd = os.getcwd()
    except OSError as exc:  # a directory removed under the shell: in-process says so
        raise _NotTaken(replaced=False) from exc
    tty = _terminal_fd()
    fds = [0, 1, 2] if tty is None else [0, 1, 2, tty]
    request = {
        "op": "run",
        "version": code_version(),
        "argv": list(argv),
        "cwd": cwd,
        "env": dict(os.environ),
        "umask": umask,
        "tty": tty is not None,
    }
    try:
        link.send(request, fds)
    except OSError as exc:
        raise _NotTaken(replaced=False) from exc
    finally:
        if tty is not None:
            os.close(tty)
    previous = {sig: _signal.getsignal(sig) for sig in FORWARDED}

    def forward(signum: int, frame: object) -> None:
        try:
            link.send({"signal": signum})
        except OSError:
            pass

    for sig in FORWARDED:
        _signal.signal(sig, forward)
    try:
        while True:
            try:
                message, _ = link.receive()
            except (OSError, ValueError):
                message = None
            if message is None:
                _say(
                    "the Warren server's session process ended without an exit code (the "
                    "server was stopped or killed); `warren --continue` resumes the session"
                )
                return EXIT_SERVER_GONE
            if "refused" in message:  # it could not fork, or take the descriptors or cwd
                why = "".join(c if c.isprintable() else "?" for c in str(message["refused"]))
                _say(f"the Warren server could not take this run ({why[:200]}); it runs here")
                raise _NotTaken(replaced=False)
            if "mismatch" in message:
                raise _NotTaken(replaced=True)
            if "exit" in message:
                return int(message["exit"])
    finally:
        for sig, handler in previous.items():
            _signal.signal(sig, handler)


def _wants_print(argv: Sequence[str]) -> bool:
    return any(arg in ("-p", "--print") or arg.startswith(("--print=", "-p")) for arg in argv)


def maybe_start_server(argv: Sequence[str]) -> None:
    """Start a server in the background for the next run, when this one is a person's: an
    interactive session at a terminal (stdin and stdout), never `-p`, never with `CI` set,
    never under tests (`PYTEST_CURRENT_TEST`), never when opted out."""
    environ = os.environ
    if (
        _opted_out(argv, environ)
        or _wants_print(argv)
        or environ.get("CI")
        or environ.get("PYTEST_CURRENT_TEST")
        or not (os.isatty(0) and os.isatty(1))
    ):
        return
    spawn_server(idle_timeout=None)


def server_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The server's own environment: what finding Python, Warren and the user's directories
    takes, nothing else (no API key: each request brings its session's environment)."""
    return {
        key: value
        for key, value in environ.items()
        if key in _SERVER_ENV or key.startswith(_SERVER_ENV_PREFIXES)
    }


def spawn_server(idle_timeout: float | None, *, entry: str | None = None) -> int:
    """Start `python -m orchestrator.cli.warm.server` detached (its own process session, stdio
    on /dev/null, cwd /) and return its pid without waiting. `entry` is the tests' seam."""
    import subprocess  # only on this path: it costs milliseconds to import

    argv = [sys.executable, "-m", "orchestrator.cli.warm.server"]
    if idle_timeout is not None:
        argv += ["--idle-timeout", str(idle_timeout)]
    if entry is not None:
        argv += ["--entry", entry]
    process = subprocess.Popen(
        argv,
        env=server_env(),
        cwd="/",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return process.pid
