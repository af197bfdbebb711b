"""One supervised child: a protocol-speaking process the coordinator starts, talks to and stops.

Tool hosts (`workers.toolhost_runner`) and pool workers (`workers.pool`) are both such
children, so both are run by `run_child` and are `SupervisedChild`s:

- start: the spawner (`HostSpawner`: sandboxed, or not for protocol tests) starts the process
  with piped stdio; a spawner that fails is a `ChildStartError`;
- handshake: the child's first stdout line must be `Ready` with our protocol version; a child
  that exits first is reported with its exit status and the tail of its stderr;
- stderr relay: the child's log lines (JSON from the child, or anything a tool printed) go
  into our log as `<kind>: <event>` / `<kind> output`, a tail is kept for error messages, and
  a hook may count and refuse lines (the pool's log limit);
- shielded send: a line is written whole or not at all (a line cut by a cancellation would
  corrupt every later one), and a child that takes none for `SEND_TIMEOUT_S` is killed as
  wedged;
- shutdown (always, shielded): `Shutdown`, `stop_grace_s` seconds to exit, then the spawner's
  own teardown: end of stdin, SIGTERM, its grace, SIGKILL, reap (`unsandboxed_spawner`: 2 s
  each; `sandbox.run`: its documented grace). The stderr relay gets `stop_grace_s` more to
  drain, then is cancelled (a grandchild outside a pid namespace may hold the pipe open);
- status: the exit status or the signal that killed it, as words.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import pydantic
import trio

from sandbox.errors import SandboxError
from workers import protocol as wire

__all__ = [
    "SEND_TIMEOUT_S",
    "STDERR_TAIL_BYTES",
    "ChildGone",
    "ChildStartError",
    "ChildStarter",
    "HostLaunch",
    "HostProcess",
    "HostSpawner",
    "RemoteHostProcess",
    "SupervisedChild",
    "run_child",
]

SEND_TIMEOUT_S = 30.0
"""Seconds a child has to take one message off its stdin before it is killed as wedged."""

STDERR_TAIL_BYTES = 4096
"""Bytes of a child's stderr kept for the message of a child that failed to start."""

_STDERR_LINE_BYTES = 65_536


@dataclass(frozen=True)
class HostLaunch:
    """What a spawner needs to start one child (a tool host or a pool worker)."""

    role: wire.HostRole
    argv: tuple[str, ...]
    """The child's own command (`python -I -m workers workers.toolhost ...`), before
    sandboxing."""
    workspace: Path
    extra_roots: tuple[Path, ...]
    cwd: Path
    write_paths: tuple[Path, ...] = ()
    """A scoped writer's directories (absolute, without symlinks: orchestrator/calls/scopes.py):
    only these are writable, the roots read-only. Empty: the role decides."""

    @property
    def writable(self) -> bool:
        return self.role == "read_write"

    @classmethod
    def of_module(
        cls,
        module: str,
        *,
        python: Path,
        role: wire.HostRole,
        workspace: Path,
        cwd: Path,
        extra_roots: tuple[Path, ...],
        tools: str,
        session_id: str | None = None,
        read_deny: tuple[tuple[str, str], ...] = (),
    ) -> HostLaunch:
        """`python -I -m workers module` (workers/__main__.py) with the arguments every
        worker entry point takes (the tool host's and the agent worker's)."""
        argv = [str(python), "-I", "-m", "workers", module, "--role", role]
        argv += ["--workspace", str(workspace)]
        argv += ["--cwd", str(cwd), "--tools", tools]
        if session_id is not None:
            argv += ["--session-id", session_id]
        for root in extra_roots:
            argv += ["--extra-root", str(root)]
        if read_deny:
            argv += ["--read-deny", json.dumps(read_deny)]
        return cls(
            role=role, argv=tuple(argv), workspace=workspace, extra_roots=extra_roots, cwd=cwd
        )


class HostProcess(Protocol):
    """The process surface a child needs: `trio.Process` and `sandbox.SandboxProcess`."""

    @property
    def pid(self) -> int: ...
    @property
    def stdin(self) -> trio.abc.SendStream | None: ...
    @property
    def stdout(self) -> trio.abc.ReceiveStream | None: ...
    @property
    def stderr(self) -> trio.abc.ReceiveStream | None: ...
    @property
    def returncode(self) -> int | None: ...
    async def wait(self) -> int: ...
    def kill(self) -> None: ...


@runtime_checkable
class RemoteHostProcess(HostProcess, Protocol):
    """A child running on another machine (a Ray pool worker, workers/remote/process.py): its
    pid is the node's, so the coordinator asks it for its usage instead of measuring, and it
    is brought up to date before each run (the workspace snapshot it reads)."""

    @property
    def where(self) -> str:
        """Where it runs, for messages and results (`node 1a2b3c4d (10.0.0.7)`)."""
        ...

    async def usage(self) -> tuple[int, float] | None:
        """Resident memory (bytes) and CPU time (seconds) of its process tree, measured on
        its node; None when it is gone."""
        ...

    async def prepare_run(self) -> str | None:
        """Bring what it reads up to date for the next run (called while it is idle); the
        id of the workspace snapshot it will see, if any.

        **Errors:** `OSError` when it cannot be reached or updated."""
        ...


HostSpawner = Callable[[HostLaunch], AbstractAsyncContextManager[HostProcess]]
"""Starts a child with piped stdin, stdout and stderr; leaving the context stops and reaps it
(bounded, shielded). Raises `SandboxError` or `OSError` when it cannot start."""


class ChildStartError(Exception):
    """The child could not be started, or exited or spoke nonsense before `Ready`. Callers
    translate it into their own error (`ToolHostError`, `WorkerStartError`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ChildGone(Exception):
    """A message could not be sent: the child's stdin is closed, or it was killed as wedged."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(eq=False)
class SupervisedChild:
    """One running child as the coordinator sees it. Subclasses add what their protocol
    needs (the tool host's waiting calls, the worker's channels and limits)."""

    process: HostProcess
    label: str
    """How messages name it: `the read_write tool host`, `a worker`."""
    alive: bool = field(default=True, kw_only=True)
    """False from the moment its stdout ended or it was told to stop."""
    stderr_tail: bytearray = field(default_factory=bytearray, kw_only=True)
    stderr_closed: trio.Event = field(default_factory=trio.Event, kw_only=True)
    stderr_scope: trio.CancelScope = field(
        default_factory=lambda: trio.CancelScope(shield=True), kw_only=True
    )
    """Shielded, so the child can log while it stops; cancelled once the process is reaped."""
    send_lock: trio.Lock = field(default_factory=trio.Lock, kw_only=True)

    async def send(self, message: pydantic.BaseModel) -> None:
        """Write one message, whole (see `send_bytes`)."""
        await self.send_bytes(wire.encode(message))

    async def send_bytes(self, data: bytes) -> None:
        """Write whole lines: shielded, since a line cut short by a cancellation would corrupt
        the stream for every later message. A child that does not take them within
        `SEND_TIMEOUT_S` is killed (it is wedged; `wedged` is told first).

        **Errors:** `ChildGone` when its stdin is gone or it was killed as wedged.
        """
        stdin = self.process.stdin
        assert stdin is not None
        with trio.CancelScope(shield=True) as scope:
            scope.relative_deadline = SEND_TIMEOUT_S
            try:
                async with self.send_lock:
                    await stdin.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise ChildGone(f"{self.label} is gone") from exc
        if scope.cancelled_caught:
            self.wedged()
            raise ChildGone(f"{self.label} took no input for {SEND_TIMEOUT_S:g} s and was killed")

    def wedged(self) -> None:
        """Called when the child took no input for `SEND_TIMEOUT_S`: kill it."""
        self.process.kill()

    def accept_log_line(self, size: int) -> bool:
        """Called for each stderr line (its size in bytes) before it is relayed; False drops
        it. The pool counts log bytes here and kills a worker past its limit."""
        return True

    def status(self) -> str:
        """How the process ended, in words (`exit status 1`, `killed by SIGKILL`)."""
        code = self.process.returncode
        if code is None:
            return "it stopped answering"
        signum = -code if code < 0 else code - 128 if code > 128 else 0
        try:
            name = signal.Signals(signum).name if signum else ""
        except ValueError:
            name = f"signal {signum}"
        if code < 0:
            return f"killed by {name}"
        return f"exit status {code}" + (f", killed by {name}" if name else "")


C = TypeVar("C", bound=SupervisedChild)


class ChildStarter(Generic[C]):
    """Starts children of one kind on a nursery the owner holds, each run by `run_child`;
    the tool-host runner and the worker pool each keep one.

    `make(process, launch)` wraps a started process in the owner's `SupervisedChild`;
    `label(launch)` names a child in messages; `serve`, `on_ready`, `on_stopping` and
    `on_stopped` are `run_child`'s.
    """

    def __init__(
        self,
        nursery: trio.Nursery,
        spawner: HostSpawner,
        make: Callable[[HostProcess, HostLaunch], C],
        *,
        label: Callable[[HostLaunch], str],
        serve: Callable[[C, wire.LineReader], Awaitable[None]],
        log: Any,
        kind: str,
        start_timeout_s: float,
        stop_grace_s: float,
        on_ready: Callable[[C], None] | None = None,
        on_stopping: Callable[[C], None] | None = None,
        on_stopped: Callable[[C], None] | None = None,
    ) -> None:
        self._nursery = nursery
        self._spawner = spawner
        self._make = make
        self._label = label
        self._serve = serve
        self._log = log
        self._kind = kind
        self._start_timeout_s = start_timeout_s
        self._stop_grace_s = stop_grace_s
        self._on_ready = on_ready
        self._on_stopping = on_stopping
        self._on_stopped = on_stopped

    async def start(self, launch: HostLaunch) -> C:
        """Start one child and return it once it said `Ready`; it then runs on the nursery
        until its stdout ends or the nursery is cancelled.

        **Errors:** `ChildStartError` when it cannot start, says no `Ready`, or takes longer
        than `start_timeout_s` (it is stopped and reaped first).
        """
        with trio.move_on_after(self._start_timeout_s):
            child: C = await self._nursery.start(self._run, launch)
            return child
        raise ChildStartError(
            f"{self._label(launch)} did not start within {self._start_timeout_s:g} s"
        )

    async def _run(
        self, launch: HostLaunch, task_status: trio.TaskStatus[C] = trio.TASK_STATUS_IGNORED
    ) -> None:
        label = self._label(launch)
        await run_child(
            self._spawner,
            launch,
            lambda process: self._make(process, launch),
            label=label,
            nursery=self._nursery,
            log=self._log,
            kind=self._kind,
            stop_grace_s=self._stop_grace_s,
            serve=self._serve,
            on_ready=self._on_ready,
            on_stopping=self._on_stopping,
            on_stopped=self._on_stopped,
            task_status=task_status,
        )


async def run_child(
    spawner: HostSpawner,
    launch: HostLaunch,
    make: Callable[[HostProcess], C],
    *,
    label: str,
    nursery: trio.Nursery,
    log: Any,
    kind: str,
    stop_grace_s: float,
    serve: Callable[[C, wire.LineReader], Awaitable[None]],
    on_ready: Callable[[C], None] | None = None,
    on_stopping: Callable[[C], None] | None = None,
    on_stopped: Callable[[C], None] | None = None,
    task_status: trio.TaskStatus[C] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one child from spawn to reaping; use with `nursery.start`.

    Spawns it (`make` wraps the process), relays its stderr (on `nursery`, as `kind`), waits
    for `Ready`, calls `on_ready` and reports the child started, then `serve`s its stdout until
    it ends (or `serve` returns). Teardown, always and shielded: `on_stopping` (the child is
    no longer alive), `Shutdown` with `stop_grace_s` to exit, the spawner's SIGTERM/SIGKILL,
    up to `stop_grace_s` for the stderr relay to drain, then `on_stopped`.

    **Cancellation:** stops the child as above, then propagates.
    **Errors:** `ChildStartError` when it cannot start or says no `Ready`, raised from
    `nursery.start` once the process is stopped and reaped.
    """
    child: C | None = None
    failure: str | None = None
    try:
        async with AsyncExitStack() as stack:
            try:
                process = await stack.enter_async_context(spawner(launch))
            except (SandboxError, OSError) as exc:
                raise ChildStartError(f"{label} could not start: {exc}") from exc
            child = make(process)
            try:
                assert process.stdout is not None and process.stderr is not None
                nursery.start_soon(_relay_stderr, child, process.stderr, log, kind)
                reader = wire.LineReader(process.stdout)
                ready = await _await_ready(child, reader, stop_grace_s)
                if isinstance(ready, str):
                    failure = ready
                else:
                    if on_ready is not None:
                        on_ready(child)
                    task_status.started(child)
                    await serve(child, reader)
            finally:
                child.alive = False
                if on_stopping is not None:
                    on_stopping(child)
                with trio.CancelScope(shield=True):
                    await _shutdown(child, stop_grace_s)
    finally:
        if child is not None:
            with trio.CancelScope(shield=True):
                # A process the child left behind (possible only without the sandbox's pid
                # namespace) may hold stderr open; the child's own logs are in by now.
                with trio.move_on_after(stop_grace_s):
                    await child.stderr_closed.wait()
                child.stderr_scope.cancel()
                if on_stopped is not None:
                    on_stopped(child)
    if failure is not None:
        raise ChildStartError(failure)


async def _await_ready(
    child: SupervisedChild, reader: wire.LineReader, grace_s: float
) -> wire.Ready | str:
    """The child's `Ready`, or why there is none (the caller bounds the wait)."""
    line = await reader.next()
    if line is None or isinstance(line, wire.Oversized):
        await child.process.wait()
        with trio.move_on_after(grace_s):
            await child.stderr_closed.wait()
        tail = child.stderr_tail.decode(errors="replace").strip()
        return f"{child.label} exited before it was ready ({child.status()})" + (
            f": {tail[-1000:]}" if tail else ""
        )
    message = wire.decode_line(line)
    if not isinstance(message, wire.Ready):
        return f"{child.label} did not start with Ready: {line[:200]!r}"
    if message.version != wire.PROTOCOL_VERSION:
        return (
            f"{child.label} speaks protocol {message.version}, this coordinator "
            f"{wire.PROTOCOL_VERSION}; reinstall Warren so both come from the same version"
        )
    return message


async def _shutdown(child: SupervisedChild, grace_s: float) -> None:
    """Ask a live child to stop and give it `grace_s` (called shielded); the spawner's
    teardown then closes stdin, SIGTERMs and SIGKILLs what is left, and reaps."""
    if child.process.returncode is not None:
        return
    with trio.move_on_after(grace_s):
        with contextlib.suppress(ChildGone):
            # The base send: a subclass's may turn ChildGone into its own error, and a child
            # killed just now (a retired host) is gone before it was reaped.
            await SupervisedChild.send_bytes(child, wire.encode(wire.Shutdown()))
        await child.process.wait()


async def _relay_stderr(
    child: SupervisedChild, stream: trio.abc.ReceiveStream, log: Any, kind: str
) -> None:
    """The child's logs into ours, tagged with its pid; keeps a tail for error messages."""
    log = log.bind(child=child.label, pid=child.process.pid)
    reader = wire.LineReader(stream, max_bytes=_STDERR_LINE_BYTES)
    try:
        with child.stderr_scope:
            while (line := await reader.next()) is not None:
                size = line.size if isinstance(line, wire.Oversized) else len(line)
                if not child.accept_log_line(size + 1) or isinstance(line, wire.Oversized):
                    continue
                child.stderr_tail += line + b"\n"
                del child.stderr_tail[:-STDERR_TAIL_BYTES]
                _relay(log, kind, line)
    except (trio.ClosedResourceError, trio.BrokenResourceError):
        pass  # the spawner closed the pipe while stopping the child
    finally:
        child.stderr_closed.set()


def _relay(log: Any, kind: str, line: bytes) -> None:
    """One line of a child's log (JSON from its logger, or anything a tool printed)."""
    try:
        event = json.loads(line)
    except ValueError:
        event = None
    with contextlib.suppress(OSError):  # a log that cannot be written must not stop us
        if isinstance(event, dict):
            name = str(event.pop("event", ""))
            event.pop("timestamp", None)
            level = str(event.pop("level", "info"))
            log.info(f"{kind}: {name}", child_level=level, child=event)
        else:
            log.info(f"{kind} output", line=line.decode(errors="replace")[:2000])
