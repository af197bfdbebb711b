"""`ZygoteSpawner`: the pool's spawner that forks read-only workers from a zygote.

A `HostSpawner` (workers/child.py) wrapped around the session's `SandboxedSpawner`: a launch
of `workers.agent_worker` in the read-only role is forked by the zygote (workers/zygote.py),
sandboxed with the same spec as a fresh read-only worker; everything else (writable and scoped
writers, other programs) goes to the fresh spawner. When the zygote cannot be made (no user
namespaces inside the sandbox, an unsupported machine) every launch goes to the fresh spawner,
and the log says why, once.

What differs from a fresh worker's sandbox (workers/README.md "Zygote"): its proc is
read-only; it has no cgroup of its own (its rlimits are its own: memory per process, its
processes counted in its own user namespace, and by a watchdog here, as `sandbox.run` does for
a fresh one); nested user namespaces are refused by seccomp rather than by bwrap's
`--disable-userns`.

The zygote fork protocol itself (the request, the pipes handed over, the pidfd and the exit
records that come back) is `sandbox.process.zygote`'s, which the warm server's tool-host
template speaks too; a forked worker is stopped as a fresh one is
(`sandbox.process.child.stop_child`).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import structlog
import trio

from sandbox import nsfork
from sandbox.errors import SandboxError
from sandbox.limits import count_namespace_processes
from sandbox.process.child import KILL_GRACE_S, stop_child
from sandbox.process.held import HeldProcess
from sandbox.process.zygote import AsyncZygoteLink, ForkedProcess, ForkRequest
from sandbox.run import WATCHDOG_INTERVAL_S, open_sandboxed_process
from sandbox.seccomp import SUPPORTED_ARCHES
from workers.child import HostLaunch, HostProcess
from workers.toolhost_runner import SandboxedSpawner

__all__ = ["ForkedWorker", "ZygoteSpawner"]

_READY_TIMEOUT_S = 30.0
_EXIT_RECORD_WAIT_S = 2.0


class ForkedWorker:
    """A worker the zygote forked, as the pool sees it (the `HostProcess` surface): its host
    pid, its protocol pipes and stderr, signals through a pidfd, its exit status as the
    zygote reaped it."""

    def __init__(self, forked: ForkedProcess) -> None:
        self._held = HeldProcess(forked.pidfd, forked.pid)
        self.pid = forked.pid
        self.stdin: trio.lowlevel.FdStream | None = trio.lowlevel.FdStream(forked.stdin)
        self.stdout: trio.lowlevel.FdStream | None = trio.lowlevel.FdStream(forked.stdout)
        self.stderr: trio.lowlevel.FdStream | None = trio.lowlevel.FdStream(forked.stderr)
        self._status: int | None = None
        self._wait_lock = trio.Lock()
        self.exited = trio.Event()
        """Set when the zygote reported its exit status (`returncode`)."""

    @property
    def returncode(self) -> int | None:
        return self._status

    def _exited(self, status: int) -> None:
        self._status = status
        self.exited.set()

    async def wait(self) -> int:
        """Wait until it is gone and its status known (the zygote reaps it; a zygote that is
        gone itself took the worker along: SIGKILL)."""
        async with self._wait_lock:  # one task at a time may wait on a descriptor
            if self._status is None:
                await self._held.wait()
                with trio.move_on_after(_EXIT_RECORD_WAIT_S):
                    await self.exited.wait()
                if self._status is None:
                    self._exited(-signal.SIGKILL)
        assert self._status is not None
        return self._status

    def send_signal(self, sig: int) -> None:
        if self._status is None:
            self._held.signal(sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def aclose(self) -> None:
        self._held.close()
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                await stream.aclose()


class _Zygote:
    """One running zygote: its sandbox and our end of its control socket."""

    def __init__(self, link: AsyncZygoteLink, process: HostProcess) -> None:
        self.link = link
        self.process = process

    @property
    def alive(self) -> bool:
        return self.link.alive

    async def fork(
        self, launch: HostLaunch, limits: dict[str, object], tmp: int | None
    ) -> ForkedWorker:
        """Ask for one worker. **Errors:** `OSError` when the zygote cannot make it."""
        argv = launch.argv[launch.argv.index("workers.agent_worker") + 1 :]
        request = ForkRequest(argv=tuple(argv), limits=limits, tmp_bytes=tmp)
        exited: list[int] = []
        worker: ForkedWorker | None = None

        def on_exit(status: int) -> None:
            if worker is None:
                exited.append(status)  # before it was made (at once, from `fork`)
            else:
                worker._exited(status)

        forked = await self.link.fork(request, on_exit)
        worker = ForkedWorker(forked)
        if exited:
            worker._exited(exited[0])
        return worker


class ZygoteSpawner:
    """Read-only pool workers forked from a zygote, everything else by `fresh` (see the
    module docstring). The zygote starts on the first read-only launch and lives on
    `nursery` until `aclose`."""

    def __init__(
        self, fresh: SandboxedSpawner, nursery: trio.Nursery, *, module: str = "workers.zygote"
    ) -> None:
        """`module`: the zygote's entry point (`python -I -m module`); tests name one that
        cannot start, to see the fallback."""
        self.fresh = fresh
        self._module = module
        self._nursery = nursery
        self._zygote: _Zygote | None = None
        self._start_lock = trio.Lock()
        self._stop = trio.Event()
        self.unavailable: str | None = None
        """Why there is no zygote (then every worker is fresh); None while there may be one."""
        self._log = structlog.get_logger().bind(component="zygote")

    def _forkable(self, launch: HostLaunch) -> bool:
        return (
            self.unavailable is None
            and launch.role == "read_only"
            and not launch.write_paths
            and "workers.agent_worker" in launch.argv
            and launch.argv[0] == sys.executable
        )

    @asynccontextmanager
    async def __call__(self, launch: HostLaunch) -> AsyncIterator[HostProcess]:
        zygote = await self._zygote_for(launch) if self._forkable(launch) else None
        worker: ForkedWorker | None = None
        if zygote is not None:
            spec = self.fresh.spec_for(launch)
            try:
                worker = await zygote.fork(launch, spec.limits.model_dump(), spec.limits.tmp_bytes)
            except OSError as exc:
                self._log.warning("zygote fork failed: a fresh worker instead", error=str(exc))
        if worker is None:
            async with self.fresh(launch) as process:
                yield process
            return
        try:
            async with trio.open_nursery() as nursery:
                if spec.limits.processes is not None:
                    nursery.start_soon(self._watch_processes, worker, spec.limits.processes)
                try:
                    yield worker
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await _stop(worker)

    async def _watch_processes(self, worker: ForkedWorker, limit: int) -> None:
        """`sandbox.run`'s process watchdog for a forked worker, which has no cgroup of its
        own and whose RLIMIT_NPROC does not bind host root: its processes are counted
        through its own proc, and it is killed (its pid namespace with it) at `limit`."""
        while worker.returncode is None:
            await trio.sleep(WATCHDOG_INTERVAL_S)
            count = count_namespace_processes(worker.pid)  # the worker is its pid 1
            if count is not None and count >= limit:
                self._log.warning("forked worker at its process limit: killed", limit=limit)
                worker.kill()
                return

    async def _zygote_for(self, launch: HostLaunch) -> _Zygote | None:
        async with self._start_lock:
            if self._zygote is not None and self._zygote.alive:
                return self._zygote
            if self.unavailable is not None:
                return None
            try:
                self._zygote = await self._nursery.start(self._run_zygote, launch)
            except (OSError, RuntimeError, SandboxError) as exc:
                self.unavailable = str(exc)
                self._log.warning(
                    "no zygote for pool workers: each starts a fresh interpreter", reason=str(exc)
                )
                return None
            return self._zygote

    async def _run_zygote(
        self, launch: HostLaunch, task_status: trio.TaskStatus[_Zygote] = trio.TASK_STATUS_IGNORED
    ) -> None:
        if SUPPORTED_ARCHES.get(os.uname().machine) is None:
            raise RuntimeError(f"no seccomp filter for {os.uname().machine}")
        spec = await self.fresh.full_spec(launch)
        # Limits that would count every worker together stay off the zygote's own sandbox:
        # each worker sets them for itself (sandbox.nsfork.set_limits).
        spec = spec.model_copy(
            update={"limits": spec.limits.model_copy(update={"processes": None})}
        )
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        worker_uid = os.getuid()
        nested_uid = nsfork.NESTED_UID if worker_uid == 0 else worker_uid
        argv = [launch.argv[0], "-I", "-m", self._module]
        argv += ["--control-fd", str(theirs.fileno()), "--worker-uid", str(worker_uid)]
        failure: str | None = None
        try:
            async with open_sandboxed_process(
                spec,
                argv,
                cwd=launch.cwd,
                stderr="pipe",
                host=await self.fresh.host(),
                private_pipes=True,
                pass_fds=(theirs.fileno(),),
                nested_uid=nested_uid,
            ) as process:
                theirs.close()
                control = trio.socket.from_stdlib_socket(ours)
                zygote = _Zygote(AsyncZygoteLink(control), process)
                tail = bytearray()
                drained = trio.Event()
                async with trio.open_nursery() as nursery:
                    assert process.stderr is not None
                    nursery.start_soon(self._relay, process.stderr, tail, drained)
                    ready = False
                    with trio.move_on_after(_READY_TIMEOUT_S):
                        ready = await zygote.link.hello()
                    if ready:
                        nursery.start_soon(zygote.link.read)
                        task_status.started(zygote)
                        await _first_of(self._stop.wait, process.wait)
                        control.close()
                    else:
                        process.kill()
                        with trio.move_on_after(KILL_GRACE_S):
                            await drained.wait()  # its last words, for the message
                    nursery.cancel_scope.cancel()
                if not ready:
                    failure = tail.decode(errors="replace").strip()[-500:] or "no output"
        finally:
            theirs.close()
            ours.close()
        if failure is not None:  # raised here, not inside the sandbox's nursery
            raise RuntimeError(f"the zygote did not start: {failure}")

    async def _relay(
        self, stream: trio.abc.ReceiveStream, tail: bytearray, drained: trio.Event
    ) -> None:
        """The zygote's stderr into our log (a worker's goes to the pool's relay)."""
        try:
            async for chunk in stream:
                tail += chunk
                del tail[:-4096]
                for line in chunk.decode(errors="replace").splitlines():
                    if line.strip():
                        self._log.info("zygote output", line=line[:2000])
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass
        finally:
            drained.set()

    async def aclose(self) -> None:
        """Stop the zygote (its workers, if any are left, go with its sandbox)."""
        self._stop.set()


async def _first_of(*waits: Callable[[], Awaitable[object]]) -> None:
    """Return as soon as one of `waits` does (the pool closing, the zygote gone)."""
    async with trio.open_nursery() as nursery:

        async def one(wait: Callable[[], Awaitable[object]]) -> None:
            await wait()
            nursery.cancel_scope.cancel()

        for wait in waits:
            nursery.start_soon(one, wait)


async def _stop(worker: ForkedWorker) -> None:
    """What `sandbox.run` does for a fresh one: end of stdin, SIGTERM, grace, SIGKILL."""
    await stop_child(worker, grace_s=KILL_GRACE_S, kill_wait_s=KILL_GRACE_S)
    await worker.aclose()
