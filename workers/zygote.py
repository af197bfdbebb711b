"""The zygote: a sandboxed process that has imported and warmed what a pool worker needs and
forks read-only pool workers on request, each into namespaces of its own.

    python -I -m workers.zygote --control-fd N --worker-uid U [--serves toolhost]

With `--serves toolhost` it is a tool-host template instead (the warm server's, per workspace:
orchestrator/cli/warm/spares.py): started under the read-write tool host's floor, it forks tool
hosts, each in namespaces of its own as a worker is; a request naming `read_only` paths gets a
read-only host (those mounts, and every mount below them, made read-only in the host's own
mount namespace before it drops its capabilities: `sandbox.nsfork.make_read_only`). End of its
control socket makes it fork no more; it leaves once its last host has (a host handed to a
session lives on until that session stops it).

Started by `workers.zygote_spawner.ZygoteSpawner` under the same floor as a read-only worker
(its bwrap sandbox made with `nested_uid`, see sandbox/argv.py). A forked worker shares the
zygote's pages copy-on-write, so an idle one costs its own dirty pages only (about 10 MB PSS
against 26 MB for a fresh interpreter: tests/bench/bench_pool.py).

Isolation between forked workers (pinned by tests/workers/test_zygote.py, by attack): each
worker is pid 1 of its own pid namespace, with its own user, mount, IPC, UTS, network and
cgroup namespaces, its own read-only proc, /tmp and /dev/shm, no capabilities, nested user
namespaces refused by a stacked seccomp filter, the floor's seccomp filter (inherited: no
ptrace, no process_vm_*), non-dumpable. So no worker or tool can name another worker's
processes or the zygote's (pid namespaces), and none can read their memory.

Control protocol (a SOCK_SEQPACKET socket the coordinator passed, one JSON object a message):
the zygote says `{"ready": true}` once warm; a request `{"argv": [...], "limits": {...},
"tmp_bytes": N}` with the worker's protocol stdin, stdout and its stderr as SCM_RIGHTS gets
`{"pid": N}` with a pidfd of the worker, or `{"failed": "why"}`; when a worker exits, the zygote
says `{"exited": pid, "status": code}` (its pid as the zygote sees it, the code as
`os.waitstatus_to_exitcode`). End of the socket stops the zygote (and so every worker: the
sandbox's pid namespace goes with it).
"""

from __future__ import annotations

import argparse
import array
import gc
import json
import os
import select
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sandbox import nsfork
from workers.lean import defer_unused_modules, pydantic_plugins_off

__all__ = ["main"]

_MESSAGE_BYTES = 65_536
_SERVES = ("agent_worker", "toolhost")
_WORKER_NAMESPACES = (
    nsfork.CLONE_NEWUSER
    | nsfork.CLONE_NEWNS
    | nsfork.CLONE_NEWPID
    | nsfork.CLONE_NEWIPC
    | nsfork.CLONE_NEWUTS
    | nsfork.CLONE_NEWNET
    | nsfork.CLONE_NEWCGROUP
)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: become the zygote, serve fork requests until the control socket ends."""
    parser = argparse.ArgumentParser(prog="python -m workers.zygote")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--worker-uid", type=int, required=True)
    parser.add_argument("--serves", choices=_SERVES, default="agent_worker")
    args = parser.parse_args(argv)
    uid, gid = os.getuid(), os.getgid()
    # A pid namespace of our own, to mount a proc of it (module docstring of sandbox.nsfork);
    # this first process only waits, having imported nothing heavy.
    nsfork.unshare(nsfork.CLONE_NEWUSER | nsfork.CLONE_NEWNS | nsfork.CLONE_NEWPID)
    nsfork.map_ids((uid, gid), (uid, gid), proc=nsfork.RW_PROC)
    inner = os.fork()
    if inner:
        os.close(args.control_fd)
        _, status = os.waitpid(inner, 0)
        return os.waitstatus_to_exitcode(status) & 0xFF
    nsfork.fresh_proc()
    nsfork.drop_capabilities()
    nsfork.make_undumpable()
    pydantic_plugins_off()  # before the first model: workers/lean.py
    if args.serves == "toolhost":
        defer_unused_modules()  # as `python -I -m workers` does for a fresh host
        _warm_toolhost()
    else:
        _warm()
    control = socket.socket(fileno=args.control_fd)
    _serve(control, worker_ids=(args.worker_uid, args.worker_uid), serves=args.serves)
    return 0


def _warm_toolhost() -> None:
    """Import and warm what a tool host does before `Ready` and on its first calls (its
    tools of both roles, their input schemas, `toolhost.rehearse`), then freeze the heap, as
    `_warm` does for a worker."""
    from workers import toolhost

    for role in ("read_write", "read_only"):
        toolhost.host_tools(role).specs()
    toolhost.rehearse()
    _frozen()


def _frozen() -> None:
    if threading.active_count() != 1:  # forking with threads would copy their locks held
        raise RuntimeError(f"the zygote has threads after warming: {threading.enumerate()}")
    gc.collect()
    gc.freeze()


def _warm() -> None:
    """Import and warm what a worker does before `Ready` (its rehearsal run), once here, so
    forked workers share it; then freeze the heap (the collector would otherwise write to
    every shared object in every worker)."""
    import trio

    from workers import agent_worker

    async def rehearse() -> None:
        async def discard(_: bytes) -> None:
            return None

        worker = agent_worker.AgentWorker(
            tools=agent_worker.worker_tools("read_only"),
            workspace=Path("/"),
            cwd=Path("/"),
            send=discard,
        )
        await worker.rehearse()

    trio.run(rehearse)
    _frozen()


def _serve(control: socket.socket, *, worker_ids: tuple[int, int], serves: str) -> None:
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    control.send(json.dumps({"ready": True}).encode())
    while True:
        ready, _, _ = select.select([control.fileno(), wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        _reap(control)
        if control.fileno() in ready:
            fds = array.array("i")
            message, ancillary, _, _ = control.recvmsg(
                _MESSAGE_BYTES, socket.CMSG_SPACE(3 * fds.itemsize)
            )
            if not message:
                if serves == "toolhost":
                    _linger(control)
                return
            for level, kind, data in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
            try:
                request = json.loads(message)
                if len(fds) != 3:
                    raise ValueError(f"expected 3 descriptors, got {len(fds)}")
                pid = _fork_worker(request, list(fds), worker_ids, serves)
            except (OSError, ValueError) as exc:
                control.send(json.dumps({"failed": str(exc)}).encode())
                continue
            finally:
                for fd in fds:
                    os.close(fd)
            pidfd = os.pidfd_open(pid)
            try:
                rights = array.array("i", [pidfd])
                control.sendmsg(
                    [json.dumps({"pid": pid}).encode()],
                    [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)],
                )
            finally:
                os.close(pidfd)


def _linger(control: socket.socket) -> None:
    """No more forks: wait until every host forked is gone (they are ours to reap; leaving
    would end our pid namespace and them with it)."""
    control.close()
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            continue


def _reap(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        control.send(json.dumps({"exited": pid, "status": code}).encode())


def _fork_worker(
    request: dict[str, Any], fds: list[int], ids: tuple[int, int], serves: str
) -> int:
    """Fork a middle process that makes the worker's namespaces and forks the worker (pid 1
    of its pid namespace), then exits: the worker is then our child (we are pid 1 here).
    Returns the worker's pid; the worker never returns."""
    report_r, report_w = os.pipe()
    middle = os.fork()
    if middle == 0:
        status = 127
        try:
            os.close(report_r)
            uid, gid = os.getuid(), os.getgid()
            nsfork.unshare(_WORKER_NAMESPACES)
            nsfork.map_ids(ids, (uid, gid), proc=nsfork.RW_PROC)
            worker = os.fork()
            if worker:
                os.write(report_w, str(worker).encode())
                status = 0
            else:
                os.close(report_w)
                status = _become_worker(request, fds, serves)
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


def _become_worker(request: dict[str, Any], fds: list[int], serves: str) -> int:
    """In the worker's new namespaces, with all capabilities there: finish its sandbox (the
    `read_only` mounts of a read-only tool host made so), drop them, and serve the protocol
    as `workers.agent_worker` (or `workers.toolhost`)."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    proto_in, proto_out, stderr = fds
    os.dup2(stderr, 2)
    tmp_bytes = request.get("tmp_bytes")
    nsfork.hide_rw_proc()
    nsfork.fresh_proc()
    nsfork.private_tmp(tmp_bytes)  # the zygote's are shared by every worker
    nsfork.mount_tmpfs("/dev/shm", tmp_bytes)
    nsfork.loopback_up()
    read_only = request.get("read_only") or []
    if read_only:
        nsfork.make_read_only([str(path) for path in read_only])
    nsfork.drop_capabilities()
    from sandbox.seccomp import build_no_userns_filter

    program = build_no_userns_filter()
    if program is not None:
        nsfork.install_filter(program)
    nsfork.set_limits(request.get("limits") or {})
    nsfork.make_undumpable()
    keep = {0, 1, 2, proto_in, proto_out}
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            try:
                os.close(int(name))
            except OSError:
                pass
    os.environ["WARREN_PIPE_FDS"] = f"{proto_in},{proto_out}"
    if serves == "toolhost":
        from workers import toolhost

        return toolhost.main([str(a) for a in request["argv"]])
    from workers import agent_worker

    return agent_worker.main([str(a) for a in request["argv"]])


if __name__ == "__main__":
    sys.exit(main())
