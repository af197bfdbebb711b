"""The zygote fork protocol: a warmed, sandboxed process (a zygote) forks new processes on
request, each into namespaces of its own, and hands back a pidfd of each; both ends of it.

One zygote program serves it (workers/zygote.py: the pool's zygote, and with `--serves
toolhost` the warm server's tool-host template); two askers speak it: the pool's spawner, on
trio (`AsyncZygoteLink`, workers/zygote_spawner.py), and the warm server, which runs no event
loop (`ZygoteLink`, orchestrator/cli/warm/host_template.py).

The protocol, on a SOCK_SEQPACKET socket passed to the zygote, one JSON object a message:

* zygote -> asker `{"ready": true}` once warm (`Ready`);
* asker -> zygote `{"argv": [...], "limits": {...}, "tmp_bytes": N, "read_only": [...]}`
  (`ForkRequest`) with the new process's stdin (read end), stdout and stderr (write ends) as
  SCM_RIGHTS;
* zygote -> asker `{"pid": N}` with a pidfd of it (`Forked`), or `{"failed": "why"}`
  (`Refused`); one answer per request, in order;
* zygote -> asker `{"exited": pid, "status": code}` whenever one of its processes exits
  (`Exited`: its pid as the zygote sees it, the code as `os.waitstatus_to_exitcode`);
* end of the socket: the asker is gone; the zygote forks no more and leaves (at once, which
  ends its sandbox's pid namespace and every process it forked; or, with `linger`, once the
  last of them has gone: a tool host handed to a session lives on).

How a process is made (`fork_into_namespaces`, in the zygote): a middle process unshares the
`NAMESPACES`, maps the ids, forks the new process (pid 1 of its pid namespace) and exits, so
the new process is the zygote's child (the zygote is pid 1 of its own namespace and reaps
it); the middle reports its pid on a pipe. The kernel rules behind it are in
`sandbox.nsfork`; what the new process does next (finishing its sandbox, serving) is the
zygote program's.

Neither end imports trio or `subprocess` at module level: the zygote imports this before
`workers.lean` defers the modules trio names.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, assert_never

from sandbox import nsfork
from sandbox.process.handover import (
    StdioPipes,
    close_all,
    pid_of,
    receive_with_fds,
    receive_with_fds_async,
    send_with_fds,
    send_with_fds_async,
)

if TYPE_CHECKING:
    import trio

__all__ = [
    "MESSAGE_BYTES",
    "NAMESPACES",
    "AsyncZygoteLink",
    "Exited",
    "ForkRequest",
    "Forked",
    "ForkedProcess",
    "Ready",
    "Refused",
    "ZygoteLink",
    "ZygoteMessage",
    "announce_ready",
    "fork_into_namespaces",
    "parse",
    "serve_forks",
]

MESSAGE_BYTES = 65_536
"""The largest message either end reads."""

NAMESPACES = (
    nsfork.CLONE_NEWUSER
    | nsfork.CLONE_NEWNS
    | nsfork.CLONE_NEWPID
    | nsfork.CLONE_NEWIPC
    | nsfork.CLONE_NEWUTS
    | nsfork.CLONE_NEWNET
    | nsfork.CLONE_NEWCGROUP
)
"""What each forked process gets of its own: user, mount, pid, IPC, UTS, network, cgroup."""

_REQUEST_FDS = 3


@dataclass(frozen=True, slots=True)
class ForkRequest:
    """What a new process is to be: the arguments of the program the zygote serves, its
    limits (`sandbox.nsfork.set_limits`), the size of its /tmp and /dev/shm, and the mounts to
    make read-only in its own mount namespace (a read-only tool host from a read-write
    template)."""

    argv: tuple[str, ...]
    limits: Mapping[str, Any] = field(default_factory=dict)
    tmp_bytes: int | None = None
    read_only: tuple[str, ...] = ()

    def encode(self) -> bytes:
        return json.dumps(
            {
                "argv": list(self.argv),
                "limits": dict(self.limits),
                "tmp_bytes": self.tmp_bytes,
                "read_only": list(self.read_only),
            }
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> ForkRequest:
        """**Errors:** `ValueError` when `data` is not a request."""
        message = json.loads(data)
        if not isinstance(message, dict) or not isinstance(message.get("argv"), list):
            raise ValueError("a fork request is an object with an argv list")
        tmp = message.get("tmp_bytes")
        return cls(
            argv=tuple(str(a) for a in message["argv"]),
            limits=dict(message.get("limits") or {}),
            tmp_bytes=int(tmp) if tmp is not None else None,
            read_only=tuple(str(p) for p in message.get("read_only") or ()),
        )


@dataclass(frozen=True, slots=True)
class Ready:
    """The zygote has warmed and takes requests."""


@dataclass(frozen=True, slots=True)
class Forked:
    """The answer to a request: the new process, `pid` as the zygote sees it, and a pidfd of
    it (now the receiver's to close)."""

    pid: int
    pidfd: int


@dataclass(frozen=True, slots=True)
class Refused:
    """The answer to a request the zygote could not make a process of."""

    reason: str


@dataclass(frozen=True, slots=True)
class Exited:
    """A process the zygote forked has exited (`pid` as the zygote sees it)."""

    pid: int
    status: int


ZygoteMessage = Ready | Forked | Refused | Exited


def parse(data: bytes, fds: Sequence[int]) -> ZygoteMessage:
    """The message the zygote sent as `data` with `fds`. Descriptors a message must not carry
    are closed here; a `Forked` holds the one it must.

    **Errors:** `ValueError` when it is no message of the protocol (its descriptors closed).
    """
    try:
        message = json.loads(data)
        if not isinstance(message, dict):
            raise ValueError("a zygote message is a JSON object")
        if "pid" in message and len(fds) == 1:
            return Forked(pid=int(message["pid"]), pidfd=fds[0])
        close_all(fds)
        if "pid" in message:
            return Refused(f"{len(fds)} descriptors came with the pid, not its pidfd")
        if "failed" in message:
            return Refused(str(message["failed"]))
        if "exited" in message:
            return Exited(pid=int(message["exited"]), status=int(message["status"]))
        if message.get("ready"):
            return Ready()
    except (ValueError, TypeError, KeyError) as exc:
        close_all(fds)
        raise ValueError(f"not a zygote message: {data[:200]!r}") from exc
    raise ValueError(f"not a zygote message: {data[:200]!r}")


# -- the zygote's end ---------------------------------------------------------------------------


def announce_ready(control: socket.socket) -> None:
    """Tell the asker we take requests (once warm)."""
    control.send(json.dumps({"ready": True}).encode())


def serve_forks(
    control: socket.socket,
    become: Callable[[ForkRequest, list[int]], int],
    *,
    ids: tuple[int, int],
    linger: bool,
) -> None:
    """The zygote's loop: announce `Ready`, then make a process of each request
    (`fork_into_namespaces`, mapping its root to `ids` (uid, gid) outside; in it,
    `become(request, [stdin, stdout, stderr])` returns its exit status), answer with its pid
    and a pidfd, and report every exit of one, until the asker closes the socket. Then
    return at once, or with `linger` once the last process forked has exited (they are ours
    to reap; leaving would end our pid namespace and them with it)."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    announce_ready(control)
    while True:
        ready, _, _ = select.select([control.fileno(), wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        _report_exits(control)
        if control.fileno() not in ready:
            continue
        data, fds = receive_with_fds(control, max_fds=_REQUEST_FDS, size=MESSAGE_BYTES)
        if not data:
            close_all(fds)
            if linger:
                control.close()
                _wait_for_every_child()
            return
        try:
            request = ForkRequest.decode(data)
            if len(fds) != _REQUEST_FDS:
                raise ValueError(f"expected {_REQUEST_FDS} descriptors, got {len(fds)}")
            pid = fork_into_namespaces(partial(become, request, fds), ids=ids)
        except (OSError, ValueError) as exc:
            control.send(json.dumps({"failed": str(exc)}).encode())
            continue
        finally:
            close_all(fds)
        pidfd = os.pidfd_open(pid)
        try:
            send_with_fds(control, json.dumps({"pid": pid}).encode(), [pidfd])
        finally:
            os.close(pidfd)


def _report_exits(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        control.send(json.dumps({"exited": pid, "status": code}).encode())


def _wait_for_every_child() -> None:
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            continue


def fork_into_namespaces(become: Callable[[], int], *, ids: tuple[int, int]) -> int:
    """Fork a middle process that unshares `NAMESPACES`, maps `ids` (uid, gid inside the new
    user namespace) onto its own, forks the new process (pid 1 of its pid namespace: it runs
    `become()` and exits with its result) and exits; the new process is then our child.
    Returns its pid. Call it in a zygote whose sandbox has a writable proc at
    `sandbox.nsfork.RW_PROC` (the id maps are written there).

    **Errors:** `OSError` when the namespaces could not be made (the middle's stderr says
    why)."""
    report_r, report_w = os.pipe()
    middle = os.fork()
    if middle == 0:
        status = 127
        try:
            os.close(report_r)
            uid, gid = os.getuid(), os.getgid()
            nsfork.unshare(NAMESPACES)
            nsfork.map_ids(ids, (uid, gid), proc=nsfork.RW_PROC)
            child = os.fork()
            if child:
                os.write(report_w, str(child).encode())
                status = 0
            else:
                os.close(report_w)
                status = become()
        except BaseException as exc:  # a forked child must never return to the zygote's loop
            os.write(2, f"zygote: the worker could not be made: {exc!r}\n".encode())
        finally:
            os._exit(status)
    os.close(report_w)
    try:
        data = os.read(report_r, 32)
    finally:
        os.close(report_r)
        os.waitpid(middle, 0)
    if not data:
        raise OSError("the worker's namespaces could not be made (see the zygote's log)")
    return int(data)


# -- the asker's end ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ForkedProcess:
    """A process a zygote made for us: `pid` in our pid namespace (`zygote_pid` in the
    zygote's, which its exit record names), its pidfd and our ends of its pipes (`stdin` to
    write, `stdout` and `stderr` to read), all ours to close, none inheritable."""

    pid: int
    zygote_pid: int
    pidfd: int
    stdin: int
    stdout: int
    stderr: int

    def descriptors(self) -> list[int]:
        return [self.pidfd, self.stdin, self.stdout, self.stderr]


class _Pending:
    """One request on its way: the new process's pipes (the child's ends travel with the
    request and are closed here once sent; ours are handed to the `ForkedProcess`)."""

    def __init__(self, request: ForkRequest) -> None:
        self.data = request.encode()
        self.pipes = StdioPipes.open(stderr=True)

    def handed(self) -> list[int]:
        return self.pipes.child_ends()

    def sent(self) -> None:
        self.pipes.close_child_ends()

    def result(self, reply: Forked | Refused) -> ForkedProcess:
        """**Errors:** `OSError` when it was refused or is gone already."""
        match reply:
            case Refused(reason):
                raise OSError(f"the zygote could not fork: {reason}")
            case Forked(zygote_pid, pidfd):
                try:
                    pid = pid_of(pidfd)
                except OSError:
                    os.close(pidfd)
                    raise
                pipes = self.pipes
                forked = ForkedProcess(
                    pid, zygote_pid, pidfd, pipes.ours_in, pipes.ours_out, pipes.ours_err
                )
                pipes.give_up_ours()
                for fd in forked.descriptors():
                    os.set_inheritable(fd, False)
                return forked
            case _:
                assert_never(reply)

    def close(self) -> None:
        self.pipes.close()


class ZygoteLink:
    """The asker's end for a process that runs no event loop (the warm server): the socket
    stays non-blocking between forks, the owner watches `fileno()` and calls `read_waiting`;
    `fork` blocks until the answer."""

    def __init__(self, control: socket.socket) -> None:
        control.setblocking(False)
        self._control = control
        self.ready = False
        """The zygote said `Ready`."""
        self.gone = False
        """The zygote closed its end (or the socket failed): it forks no more."""

    def fileno(self) -> int:
        """The socket's descriptor; -1 once closed."""
        return self._control.fileno()

    def read_waiting(self) -> None:
        """Take every message waiting now (exit records and strays are dropped)."""
        while not self.gone:
            message = self._receive(block=False)
            if message is None:
                return

    def fork(self, request: ForkRequest, *, timeout_s: float) -> ForkedProcess:
        """Ask for one process and wait (at most `timeout_s` for each message) for the answer.

        **Errors:** `OSError` when it cannot be made; `TimeoutError` (an `OSError`) when the
        zygote does not answer in time (it is wedged: the caller should stop it)."""
        pending = _Pending(request)
        try:
            self._control.settimeout(timeout_s)
            try:
                send_with_fds(self._control, pending.data, pending.handed())
                pending.sent()
                while True:
                    reply = self._receive(block=True)
                    if reply is None:
                        raise OSError("the zygote is gone")
                    if isinstance(reply, Forked | Refused):
                        return pending.result(reply)
            finally:
                if self._control.fileno() >= 0:
                    self._control.setblocking(False)
        finally:
            pending.close()

    def _receive(self, *, block: bool) -> ZygoteMessage | None:
        """The next message (one that is none of the protocol's is skipped); None when there
        is none now, or the zygote is gone (`gone`).

        **Errors:** with `block`, `OSError` from the socket (`TimeoutError`)."""
        while True:
            try:
                data, fds = receive_with_fds(self._control, max_fds=1, size=MESSAGE_BYTES)
            except (BlockingIOError, InterruptedError):
                return None
            except OSError:
                if block:
                    raise
                data, fds = b"", []
            if not data:
                close_all(fds)
                self.gone = True
                self._control.close()
                return None
            try:
                message = parse(data, fds)
            except ValueError:
                continue
            match message:
                case Ready():
                    self.ready = True
                case Forked(_, pidfd) if not block:
                    os.close(pidfd)  # an answer nobody waits for (a fork that timed out)
                case Forked() | Refused() | Exited():
                    pass
                case _:
                    assert_never(message)
            return message

    def close(self) -> None:
        """Close our end: the zygote forks no more."""
        self._control.close()


class AsyncZygoteLink:
    """The asker's end on trio (the pool's spawner): `read` routes the zygote's messages (run
    it in a task for as long as the zygote lives), `fork` asks for one process at a time."""

    def __init__(self, control: trio.socket.SocketType) -> None:
        import trio

        self._control = control
        self._lock = trio.Lock()
        self._send_reply: trio.MemorySendChannel[Forked | Refused]
        self._send_reply, self._replies = trio.open_memory_channel(1)
        self._watchers: dict[int, Callable[[int], None]] = {}
        """By pid as the zygote sees it: told the exit status."""
        self._early: dict[int, int] = {}
        """Exit records read before `fork` had registered their process."""
        self._unclaimed = 0
        """Answers still to come to requests whose `fork` was cancelled (dropped on arrival,
        so the next request gets its own)."""
        self.alive = True
        """False once the zygote has closed its end (or the socket failed)."""

    async def hello(self) -> bool:
        """Wait for the zygote's first message: True when it is `Ready` (the caller bounds
        the wait).

        **Cancellation:** nothing is lost but the wait.
        **Errors:** `OSError` from the socket."""
        data, fds = await receive_with_fds_async(self._control, max_fds=1, size=MESSAGE_BYTES)
        try:
            return bool(data) and isinstance(parse(data, fds), Ready)
        except ValueError:
            return False

    async def read(self) -> None:
        """Route the zygote's messages until it is gone: exit records to their process's
        watcher, answers to `fork`. At the end every process still watched counts as killed
        (the zygote took its pid namespace along).

        **Cancellation:** stops reading; the same end.
        **Errors:** none: a socket that fails ends it as the zygote's going does."""
        import trio

        try:
            while True:
                data, fds = await receive_with_fds_async(
                    self._control, max_fds=1, size=MESSAGE_BYTES
                )
                if not data:
                    close_all(fds)
                    break
                message = parse(data, fds)
                match message:
                    case Exited(pid, status):
                        watcher = self._watchers.pop(pid, None)
                        if watcher is not None:
                            watcher(status)
                        else:
                            self._early[pid] = status
                    case Forked() | Refused() if self._unclaimed:
                        self._unclaimed -= 1
                        _drop(message)
                    case Forked() | Refused():
                        await self._send_reply.send(message)
                    case Ready():
                        pass
                    case _:
                        assert_never(message)
        except (OSError, ValueError, trio.ClosedResourceError):
            pass
        finally:
            self.alive = False
            self._send_reply.close()
            watchers, self._watchers = self._watchers, {}
            for watcher in watchers.values():
                watcher(-signal.SIGKILL)

    async def fork(self, request: ForkRequest, on_exit: Callable[[int], None]) -> ForkedProcess:
        """Ask for one process; `on_exit(status)` is called once it has exited (from `read`,
        or at once if the record came first; `-SIGKILL` when the zygote is gone first).

        **Cancellation:** the request's pipes are closed (a process made anyway finds its
        input at its end and exits) and its answer, when it comes, is dropped.
        **Errors:** `OSError` when the zygote cannot make it or is gone."""
        import trio

        pending = _Pending(request)
        try:
            async with self._lock:
                await send_with_fds_async(self._control, pending.data, pending.handed())
                pending.sent()
                try:
                    reply = await self._replies.receive()
                except (trio.EndOfChannel, trio.ClosedResourceError) as exc:
                    raise OSError("the zygote is gone") from exc
                except trio.Cancelled:
                    self._unclaim()
                    raise
            forked = pending.result(reply)
        finally:
            pending.close()
        if forked.zygote_pid in self._early:
            on_exit(self._early.pop(forked.zygote_pid))
        else:
            self._watchers[forked.zygote_pid] = on_exit
        return forked

    def _unclaim(self) -> None:
        """A `fork` that sent its request was cancelled before its answer: drop the answer,
        whether it is waiting already or still to come."""
        import trio

        try:
            _drop(self._replies.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            self._unclaimed += 1


def _drop(reply: Forked | Refused) -> None:
    if isinstance(reply, Forked):
        os.close(reply.pidfd)
