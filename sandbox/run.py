"""Running commands under a `SandboxSpec`: one-shot (`run_sandboxed`) or long-lived
(`open_sandboxed_process`, for the tool host and pool workers).

The runner owns what the kernel cannot enforce by itself: the wall clock, the output cap, the
process watchdog (see `sandbox.limits`), the cgroup and the workspace guard's lifetime (a
writable sandbox's protected names, `sandbox.guard`). Every
sandbox it starts is killed and reaped before the call returns, whatever happens: normal exit,
a limit, an exception in the caller, or cancellation (teardown is shielded and bounded); so is
its init when it was handed to us (we are PID 1 or a subreaper, see `sandbox.process.reaper`).
The stop itself (end of input, SIGTERM, grace, SIGKILL) is the process room's
(`sandbox.process.child.stop_child`); the command that starts bwrap is `sandbox.launch`'s.

Why we spawn bwrap ourselves instead of with `trio.lowlevel.open_process`: bwrap's
`--die-with-parent` uses PR_SET_PDEATHSIG, which fires when the *thread* that forked the
child exits. trio forks from a worker thread that exits after 10 s idle, which would SIGKILL
every sandbox ten seconds in (pinned by tests/sandbox/test_run.py::test_outlives_thread_cache).
So we fork from the thread running trio (a vfork+exec, about a millisecond), and wait on a
pidfd. `SandboxProcess` offers the same surface as `trio.Process`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

import trio
from pydantic import BaseModel, ConfigDict

from sandbox.guard import WorkspaceGuard
from sandbox.host import SandboxHost, detect_host
from sandbox.launch import RunAs, launch_prefix, name_pipes, sandbox_command
from sandbox.limits import (
    SandboxCgroup,
    classify_exit,
    count_namespace_processes,
    count_sandbox_processes,
    kill_sandbox_init,
    sandbox_command_pids,
)
from sandbox.masks import HostFacts, gather_host_facts, python_runtime_paths, warren_code_paths
from sandbox.process.child import KILL_GRACE_S, REAP_TIMEOUT_S, stop_child
from sandbox.process.handover import PIPE_FDS_ENV, StdioPipes, handing_over
from sandbox.process.held import HeldProcess
from sandbox.process.reaper import reap_adopted_sandbox_inits
from sandbox.spare import Adopted, SpareRecipe, SpareSource
from sandbox.spec import LimitName, Limits, SandboxSpec

__all__ = [
    "PIPE_FDS_ENV",
    "WATCHDOG_INTERVAL_S",
    "RunAs",
    "SandboxProcess",
    "SandboxResult",
    "launch_prefix",
    "open_sandboxed_process",
    "run_sandboxed",
]

_INIT_KILL_WAIT_S = 1.0
"""Seconds bwrap has to exit after its sandbox's init was SIGKILLed, before bwrap itself is."""
WATCHDOG_INTERVAL_S = 0.1
"""How often the process watchdog counts a sandbox's processes."""
CAPPED_WATCH_INTERVAL_S = 1.0
"""How often the watchdog looks at a sandbox whose cgroup holds its process limit
(`SandboxCgroup.caps_processes`): the kernel refuses every fork past it meanwhile, and a
look is only to stop the sandbox for a refusal. Ten looks a second cost the process that
runs a long-lived sandbox 6-9 ms of CPU a second (a pool worker's coordinator, a Ray node's
actor), whatever the sandbox does."""

StdinSpec = bytes | int | Literal["inherit"] | None
"""`bytes` fed through a pipe, an fd to hand over, `"inherit"` ours, None for /dev/null."""

OutputCallback = Callable[[Literal["stdout", "stderr"], bytes], None]


class SandboxResult(BaseModel):
    """The outcome of `run_sandboxed`: never an exception for the command's own failures."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    exit_code: int
    """bwrap's exit status: the command's, or 128+N if it died of signal N (137 when the
    runner killed the sandbox for a limit; `killed_by_limit` says which)."""
    stdout: bytes
    stderr: bytes
    timed_out: bool
    """The wall-time limit ran out (`killed_by_limit` is then `wall_time`)."""
    killed_by_limit: LimitName | None
    """The limit that stopped the command, when we know one did."""
    output_truncated: bool
    """Captured output was cut at `limits.output_bytes`."""
    duration_s: float
    sandbox: str
    """Which bwrap ran it (`BwrapBinary.describe()`), for the audit log."""
    warnings: tuple[str, ...] = ()
    """Weaknesses of this particular sandbox (from `HostFacts.warnings`)."""
    undone: tuple[str, ...] = ()
    """Protected names the command created and the guard removed, one message each."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.killed_by_limit is None

    def limit_message(self, limits: Limits) -> str | None:
        """One sentence saying which limit stopped the command, or None."""
        return (
            None if self.killed_by_limit is None else describe_limit(self.killed_by_limit, limits)
        )


def describe_limit(name: LimitName, limits: Limits) -> str:
    """`the sandbox was stopped: it ran longer than the wall-time limit of 600 s`."""
    texts: dict[LimitName, str] = {
        "wall_time": f"it ran longer than the wall-time limit of {limits.wall_time_s} s",
        "output": f"it wrote more than {limits.output_bytes} bytes of output",
        "processes": f"it reached the limit of {limits.processes} processes",
        "memory": f"it used more than {limits.memory_bytes} bytes of memory",
        "cpu_time": f"it used more than {limits.cpu_time_s} s of CPU time",
        "file_size": f"it wrote a file larger than {limits.file_size_bytes} bytes",
    }
    return f"the sandbox was stopped: {texts[name]}"


class SandboxProcess:
    """A running sandbox (bwrap and everything inside). Like `trio.Process`: `stdin`,
    `stdout`, `stderr` (trio streams or None), `pid`, `returncode`, `wait()`, `send_signal()`,
    `terminate()`, `kill()`. Signalling bwrap reaches the whole sandbox: it forwards or dies,
    and its child dies with it (PDEATHSIG), taking the pid namespace along."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes] | _AdoptedPopen,
        *,
        stdin: trio.lowlevel.FdStream | None,
        stdout: trio.lowlevel.FdStream | None,
        stderr: trio.lowlevel.FdStream | None,
    ) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.args = popen.args
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self._wait_lock = trio.Lock()
        self._held: HeldProcess | None = None
        """bwrap (or the adopted process) by a pidfd of ours, to wait on; None before 5.3."""
        with contextlib.suppress(OSError, AttributeError):
            self._held = (
                HeldProcess(os.dup(popen.held.fd), popen.pid)
                if isinstance(popen, _AdoptedPopen)
                else HeldProcess.open(popen.pid)
            )
        self.adopted = isinstance(popen, _AdoptedPopen)
        """Started by another process (a spare, `sandbox.spare`), which reaps it."""
        self.forked = isinstance(popen, _AdoptedPopen) and popen.forked
        """Forked from a template (`sandbox.spare.ForkedSpare`): `pid` is the process itself,
        pid 1 of its pid namespace, not a bwrap."""
        self.killed_by_limit: LimitName | None = None
        """Set when the runner stops the sandbox for a limit (or after exit, from its
        status)."""
        self.warnings: tuple[str, ...] = ()
        """`HostFacts.warnings` of this sandbox."""
        self.guard: WorkspaceGuard | None = None
        """The writable roots' guard (None for a read-only sandbox)."""
        self.undone: tuple[str, ...] = ()
        """Messages of the guard's last drain at teardown (protected names removed)."""

    def check_changes(self) -> list[str]:
        """Undo protected names created since the last check (see `sandbox.guard`); one
        message each. Call after every call a long-lived writable sandbox ran. Cheap: one
        non-blocking read when nothing changed."""
        return [] if self.guard is None else self.guard.drain()

    def take_new_denied(self) -> list[Path]:
        """Paths the guard saw created since the last call that the read deny rules cover
        (collected by `check_changes`; see `WorkspaceGuard.denied`); each returned once."""
        if self.guard is None:
            return []
        found, self.guard.new_denied = self.guard.new_denied, []
        return found

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    async def wait(self) -> int:
        """Wait for bwrap to exit and reap it. Cancellation: safe, nothing is lost."""
        async with self._wait_lock:
            if self._popen.poll() is None:
                if self._held is not None:
                    await self._held.wait()
                else:  # kernels before 5.3: no pidfd
                    await trio.to_thread.run_sync(self._popen.wait, abandon_on_cancel=True)
            return self._popen.wait()

    def send_signal(self, sig: int) -> None:
        """Signal bwrap itself (it does not forward signals: most kill it, and then its
        child, the sandbox's init, dies of PDEATHSIG)."""
        self._popen.send_signal(sig)

    def terminate(self) -> None:
        """SIGTERM the command inside the sandbox, so it can clean up; bwrap when the
        command is not running yet."""
        if self.forked:
            self._popen.send_signal(signal.SIGTERM)
            return
        targets = sandbox_command_pids(self.pid) if self._popen.poll() is None else []
        if not targets:
            self._popen.send_signal(signal.SIGTERM)
        for pid in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the whole sandbox at once by killing its init (the kernel then kills every
        process in the pid namespace). bwrap sees its child die and exits by itself: killing
        bwrap first would orphan the init to the host's init, to be reaped there. A forked
        process is its namespace's init itself."""
        if self.forked:
            self._popen.send_signal(signal.SIGKILL)
            return
        if self._popen.poll() is None:
            if isinstance(self._popen, _AdoptedPopen):
                self._popen.signalled(signal.SIGKILL)
            if kill_sandbox_init(self.pid):
                return
        self._popen.send_signal(signal.SIGKILL)

    def _stop_for(self, limit: LimitName) -> None:
        if self.killed_by_limit is None:
            self.killed_by_limit = limit
        self.kill()

    def _close(self) -> None:
        if self._held is not None:
            self._held.close()
            self._held = None
        if isinstance(self._popen, _AdoptedPopen):
            self._popen.close()


class _AdoptedPopen:
    """The `Popen` surface `SandboxProcess` uses, for a sandbox another process started and
    reaps (a spare): signals go through its pidfd (no pid reuse can misdirect them) and its
    end is the pidfd becoming readable. Its exit status is its parent's to read: we know
    the signal we sent it, else report 0 (a tool host exits 0 when told to stop)."""

    def __init__(self, adopted: Adopted, args: Sequence[str]) -> None:
        self.pid = adopted.pid
        self.held = HeldProcess(adopted.pidfd, adopted.pid)
        self.forked = adopted.forked
        self.args = list(args)
        self.returncode: int | None = None
        self._signalled = 0

    def poll(self) -> int | None:
        if self.returncode is None and self.held.fd >= 0 and self.held.ended():
            self.returncode = -self._signalled
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self.held.wait_ended(None)
        return self.poll() or 0

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        self.signalled(sig)
        self.held.signal(sig)

    def signalled(self, sig: int) -> None:
        """`sig` was sent to it (or its sandbox's init): its status, if it ends now."""
        if sig in (signal.SIGKILL, signal.SIGTERM):
            self._signalled = sig

    def close(self) -> None:
        self.poll()
        self.held.close()


@dataclass
class _Io:
    stdin: StdinSpec
    stdout: Literal["pipe", "inherit", "devnull"]
    stderr: Literal["pipe", "inherit", "devnull"]
    private: bool = False
    """stdin and stdout pipes passed as extra descriptors (`open_sandboxed_process`)."""
    socket: int | None = None
    """With `private`: a connected socket passed as the stdin and stdout descriptors instead
    of two pipes (`open_sandboxed_process(stdio_socket=...)`)."""


@dataclass(frozen=True)
class _Launch:
    """One sandbox to start: what `run_sandboxed` and `open_sandboxed_process` were asked."""

    spec: SandboxSpec
    argv: Sequence[str]
    io: _Io
    cwd: Path | None
    host: SandboxHost
    run_as: RunAs | None
    pass_fds: tuple[int, ...] = ()
    nested_uid: int | None = None


@asynccontextmanager
async def _sandbox(
    launch: _Launch, *, graceful: bool, spares: SpareSource | None = None
) -> AsyncIterator[SandboxProcess]:
    spec, host = launch.spec, launch.host
    executables = [host.bwrap.path] + ([host.prlimit] if host.prlimit else [])
    facts, guard = await trio.to_thread.run_sync(
        partial(_prepare, spec, executables=executables, stub_dir=host.stub_dir)
    )
    cgroup: SandboxCgroup | None = None
    proc: SandboxProcess | None = None
    recipe: SpareRecipe | None = None
    adopted: Adopted | None = None
    try:
        if (
            spares is not None
            and launch.io.private
            and launch.run_as is None
            and not launch.pass_fds
            and launch.nested_uid is None
        ):
            recipe = SpareRecipe.gather(spec, facts, launch.argv, launch.cwd, host)
            adopted = await spares.claim(recipe)
        if adopted is not None:
            proc, cgroup = _adopt(adopted, launch.argv)
        else:
            cgroup = SandboxCgroup.create(host.cgroups, spec.limits)
            proc = _start(launch, facts=facts, cgroup=cgroup)
        proc.warnings = facts.warnings
        proc.guard = guard
        if adopted is None and recipe is not None and spares is not None:
            spares.report(recipe)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_processes, proc, spec.limits, cgroup)
            if spec.limits.wall_time_s is not None:
                nursery.start_soon(_wall_clock, proc, spec.limits.wall_time_s)
            try:
                yield proc
            finally:
                with trio.CancelScope(shield=True):
                    await _stop(proc, graceful=graceful)
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            if proc is not None:
                code = proc.returncode
                if proc.killed_by_limit is None and code is not None:
                    proc.killed_by_limit = classify_exit(code, spec.limits, cgroup=cgroup)
                proc._close()
                for stream in (proc.stdin, proc.stdout, proc.stderr):
                    if stream is not None:
                        await stream.aclose()
            if cgroup is not None:
                await _remove_cgroup(cgroup)
            if guard is not None:
                if proc is not None:
                    proc.undone += tuple(guard.drain())
                guard.close()
            if proc is not None:
                await reap_adopted_sandbox_inits(REAP_TIMEOUT_S)


def _start(launch: _Launch, *, facts: HostFacts, cgroup: SandboxCgroup | None) -> SandboxProcess:
    """Spawn bwrap for `launch` in `cgroup` (the cold start). Every descriptor made for bwrap
    (its ends of the pipes, the seccomp program) is closed here once it has started, or
    failed to."""
    io = launch.io
    pipes = StdioPipes(-1, -1, -1, -1)
    if io.private:
        pipes = (
            StdioPipes.open(stderr=False) if io.socket is None else StdioPipes.of_socket(io.socket)
        )
        facts = name_pipes(facts, pipes)
    with handing_over(pipes) as also_handed:
        command, seccomp_fd = sandbox_command(
            launch.spec,
            launch.argv,
            host=launch.host,
            facts=facts,
            cgroup=cgroup,
            run_as=launch.run_as,
            cwd=launch.cwd,
            nested_uid=launch.nested_uid,
        )
        program = () if seccomp_fd is None else (seccomp_fd,)
        also_handed += program
        popen = _spawn(command, io, pipes, pass_fds=launch.pass_fds + program)
    return SandboxProcess(
        popen,
        stdin=_stream(pipes.ours_in),
        stdout=_stream(pipes.ours_out),
        stderr=_stream(pipes.ours_err),
    )


def _stream(fd: int) -> trio.lowlevel.FdStream | None:
    return trio.lowlevel.FdStream(fd) if fd >= 0 else None


def _adopt(adopted: Adopted, argv: Sequence[str]) -> tuple[SandboxProcess, SandboxCgroup | None]:
    """A spare handed to us (`sandbox.spare`) as a `SandboxProcess` we own from now on."""
    cgroup = None
    if adopted.cgroup and adopted.cgroup_version in (1, 2):
        version: Literal[1, 2] = 1 if adopted.cgroup_version == 1 else 2
        cgroup = SandboxCgroup(directories=list(adopted.cgroup), version=version)
    proc = SandboxProcess(
        _AdoptedPopen(adopted, argv),
        stdin=trio.lowlevel.FdStream(adopted.stdin),
        stdout=trio.lowlevel.FdStream(adopted.stdout),
        stderr=trio.lowlevel.FdStream(adopted.stderr),
    )
    return proc, cgroup


def _prepare(
    spec: SandboxSpec, *, executables: Sequence[Path], stub_dir: Path
) -> tuple[HostFacts, WorkspaceGuard | None]:
    """Host facts and, for a writable sandbox, its started guard (in a worker thread: the
    guard's walk is the costly part). Old versions' placeholders are swept by `detect_host`."""
    roots = [w.path.resolve() for w in spec.workspaces if w.mode == "rw"]
    roots += [b.path.resolve() for b in spec.extra_binds if b.mode == "rw"]
    guard = None
    if roots:
        guard = WorkspaceGuard.start(
            roots, (p.path for p in spec.all_protected), quarantine=stub_dir.parent / "removed"
        )
    try:
        facts = gather_host_facts(
            spec,
            executables=executables,
            runtime=python_runtime_paths(),
            own_code=warren_code_paths(),
            scratch=stub_dir.parent / "home",
            nested=guard.survey.protected if guard is not None else (),
        )
    except BaseException:
        if guard is not None:
            guard.close()
        raise
    if guard is not None:
        guard.watch_paths(facts.watched)
        if guard.survey.warnings:
            facts = facts.model_copy(
                update={"warnings": facts.warnings + tuple(guard.survey.warnings)}
            )
    return facts, guard


def _spawn(
    command: list[str], io: _Io, pipes: StdioPipes, *, pass_fds: tuple[int, ...]
) -> subprocess.Popen[bytes]:
    """Start bwrap with the stdio `io` asks for, the pipes it needs made into `pipes` (the
    caller closes what is left of them). Private pipes are there already: passed as extra
    descriptors, with stdin /dev/null and stdout where stderr goes."""
    stdin: int | None
    if io.private:
        pass_fds = (*pass_fds, pipes.child_in, pipes.child_out)
        stdin = subprocess.DEVNULL
    elif isinstance(io.stdin, bytes):
        pipes.child_in, pipes.ours_in = os.pipe()
        stdin = pipes.child_in
    elif isinstance(io.stdin, int):
        stdin = io.stdin
    else:
        stdin = None if io.stdin == "inherit" else subprocess.DEVNULL
    stdout = None if io.private else _output(io.stdout, pipes, "stdout")
    stderr = _output(io.stderr, pipes, "stderr")
    return subprocess.Popen(
        command,
        stdin=stdin,
        stdout=stderr if io.private else stdout,
        stderr=stderr,
        pass_fds=pass_fds,
        env={},  # bwrap's own environ is readable inside as /proc/1/environ
        start_new_session=True,  # out of the terminal's process group: Ctrl-C is ours
    )


def _output(
    mode: Literal["pipe", "inherit", "devnull"],
    pipes: StdioPipes,
    name: Literal["stdout", "stderr"],
) -> int | None:
    """What bwrap's `name` is: the child's end of a new pipe (ours kept in `pipes`), ours
    (None), or /dev/null."""
    if mode != "pipe":
        return None if mode == "inherit" else subprocess.DEVNULL
    ours, child = os.pipe()
    if name == "stdout":
        pipes.ours_out, pipes.child_out = ours, child
    else:
        pipes.ours_err, pipes.child_err = ours, child
    return child


async def _watch_processes(
    proc: SandboxProcess, limits: Limits, cgroup: SandboxCgroup | None
) -> None:
    """Kill the sandbox when it reaches its process limit. Needed because RLIMIT_NPROC does
    not bind host root; where a cgroup holds the limit the kernel already refuses forks and
    this turns the refusal into a clear stop, looking once a second without counting."""
    if limits.processes is None:
        return
    capped = cgroup is not None and cgroup.caps_processes
    while proc.returncode is None:
        await trio.sleep(CAPPED_WATCH_INTERVAL_S if capped else WATCHDOG_INTERVAL_S)
        if cgroup is not None and cgroup.pids_max_hit():
            proc._stop_for("processes")
            return
        if capped:  # bwrap is in the cgroup too: the count stays under the limit
            continue
        count = (  # a few syscalls: no thread needed
            count_namespace_processes(proc.pid)
            if proc.forked
            else count_sandbox_processes(proc.pid)
        )
        if count is not None and count >= limits.processes:
            proc._stop_for("processes")
            return


async def _wall_clock(proc: SandboxProcess, seconds: float) -> None:
    await trio.sleep(seconds)
    if proc.returncode is None:
        proc._stop_for("wall_time")


async def _stop(proc: SandboxProcess, *, graceful: bool) -> None:
    """Make sure bwrap is gone and reaped: end of input, SIGTERM to the command and
    `KILL_GRACE_S` of grace if `graceful`, then SIGKILL to the sandbox (its init), then to
    bwrap itself. Bounded: gives up waiting after `REAP_TIMEOUT_S`."""
    await stop_child(
        proc, grace_s=KILL_GRACE_S if graceful else None, kill_wait_s=_INIT_KILL_WAIT_S
    )
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
    with trio.move_on_after(REAP_TIMEOUT_S):
        await proc.wait()


async def _remove_cgroup(cgroup: SandboxCgroup) -> None:
    with trio.move_on_after(REAP_TIMEOUT_S):
        while not cgroup.try_remove():
            cgroup.kill_all()
            await trio.sleep(0.01)


async def run_sandboxed(
    spec: SandboxSpec,
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    stdin: StdinSpec = None,
    output: Literal["capture", "inherit"] = "capture",
    on_output: OutputCallback | None = None,
    host: SandboxHost | None = None,
    run_as: RunAs | None = None,
) -> SandboxResult:
    """Run `argv` in a sandbox built from `spec` and return its outcome.

    Output is captured up to `spec.limits.output_bytes` (stdout and stderr together; more
    kills the sandbox), and passed to `on_output` as it arrives when given. With
    `output="inherit"` the command writes to our stdout/stderr directly (the CLI) and the
    output cap does not apply.

    Cancellation: the sandbox is killed and reaped (shielded, bounded), then `Cancelled`
    propagates.

    Errors: `SandboxUnavailable` (no usable bwrap), `SandboxConfigError` (the spec cannot be
    built on this host), `OSError` from spawning. The command's own failures, timeouts and
    limits are a `SandboxResult`, not exceptions.
    """
    started = time.monotonic()
    if host is None:
        host = await detect_host()
    mode: Literal["pipe", "inherit"] = "pipe" if output == "capture" else "inherit"
    io = _Io(stdin=stdin, stdout=mode, stderr=mode)
    chunks: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
    truncated = False
    cap = spec.limits.output_bytes

    async def pump(
        proc: SandboxProcess, name: Literal["stdout", "stderr"], stream: trio.abc.ReceiveStream
    ) -> None:
        nonlocal truncated
        while data := bytes(await stream.receive_some(65536)):
            if on_output is not None:
                on_output(name, data)
            if cap is not None:
                room = cap - len(chunks["stdout"]) - len(chunks["stderr"])
                if len(data) > room:
                    chunks[name] += data[: max(room, 0)]
                    truncated = True
                    proc._stop_for("output")
                    return
            chunks[name] += data

    async def feed(stream: trio.abc.SendStream, data: bytes) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(data)
            await stream.aclose()

    launch = _Launch(spec, argv, io=io, cwd=cwd, host=host, run_as=run_as)
    async with _sandbox(launch, graceful=False) as proc, trio.open_nursery() as nursery:
        if proc.stdin is not None and isinstance(stdin, bytes):
            nursery.start_soon(feed, proc.stdin, stdin)
        if proc.stdout is not None:
            nursery.start_soon(pump, proc, "stdout", proc.stdout)
        if proc.stderr is not None:
            nursery.start_soon(pump, proc, "stderr", proc.stderr)
        await proc.wait()
    code = proc.returncode if proc.returncode is not None else -signal.SIGKILL
    return SandboxResult(
        exit_code=code,
        stdout=bytes(chunks["stdout"]),
        stderr=bytes(chunks["stderr"]),
        timed_out=proc.killed_by_limit == "wall_time",
        killed_by_limit=proc.killed_by_limit,
        output_truncated=truncated,
        duration_s=time.monotonic() - started,
        sandbox=host.bwrap.describe(),
        warnings=proc.warnings,
        undone=proc.undone,
    )


@asynccontextmanager
async def open_sandboxed_process(
    spec: SandboxSpec,
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    stderr: Literal["pipe", "inherit", "devnull"] = "pipe",
    host: SandboxHost | None = None,
    run_as: RunAs | None = None,
    private_pipes: bool = False,
    pass_fds: tuple[int, ...] = (),
    nested_uid: int | None = None,
    spares: SpareSource | None = None,
    stdio_socket: int | None = None,
) -> AsyncIterator[SandboxProcess]:
    """Start a long-lived sandboxed process with stdin/stdout pipes (and stderr as asked).

    `pass_fds`: more descriptors it inherits, at the same numbers (a zygote's control
    socket). `nested_uid`: a zygote's sandbox (`sandbox.argv.bwrap_argv`).

    `spares` (with `private_pipes`): adopt a spare started from the very recipe this start
    would use (`sandbox.spare`; the recipe is gathered afresh here, so masks of files that
    appeared since count), else start cold and report the recipe.

    `private_pipes`: the two pipes are not the process's fd 0 and 1 but extra descriptors it
    finds named in `PIPE_FDS_ENV` (its fd 0 is /dev/null, fd 1 goes where stderr goes). bwrap's
    init, pid 1 of the sandbox, keeps its own stdio for its whole life and anything in the
    sandbox may open `/proc/1/fd/N`; it closes every other descriptor. A process that hides its
    pipes (the tool host and pool workers: `workers.entry`) needs this, or anything it runs
    could write into them or read from them (tests/orchestrator/test_hooks_warm.py).

    The wall-time limit and the process watchdog apply for its whole life; the output cap
    does not (the caller reads the pipes). On exit from the block the process is stopped:
    stdin closed, SIGTERM, `KILL_GRACE_S` of grace, SIGKILL, reaped
    (`sandbox.process.child.stop_child`).

    `stdio_socket` (with `private_pipes`, without `spares`): a connected socket that is the
    process's stdin and stdout instead of the two pipes (a remote worker's direct connection
    to its coordinator, workers/remote/actor.py): it gets two copies of it, named as the pipes
    are; the returned process has no `stdin` or `stdout` of ours, and the caller closes its
    own descriptor once started, leaving the process the socket's only holder.

    Cancellation: the same teardown runs shielded and bounded, then `Cancelled` propagates.

    Errors: as `run_sandboxed`.
    """
    if host is None:
        host = await detect_host()
    if stdio_socket is not None and (not private_pipes or spares is not None):
        raise ValueError("stdio_socket needs private_pipes and no spares")
    io = _Io(stdin=b"", stdout="pipe", stderr=stderr, private=private_pipes, socket=stdio_socket)
    launch = _Launch(spec, argv, io, cwd, host, run_as, pass_fds=pass_fds, nested_uid=nested_uid)
    async with _sandbox(launch, graceful=True, spares=spares) as proc:
        yield proc
