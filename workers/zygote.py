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

Control protocol: the zygote fork protocol (`sandbox.process.zygote`, which also makes each
worker's namespaces and serves the requests); this module is what the zygote warms and what a
forked worker does before it serves. End of the socket stops the zygote (and so every worker:
the sandbox's pid namespace goes with it); a template lingers until its hosts have gone.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from sandbox import nsfork
from sandbox.process import zygote
from sandbox.process.handover import PIPE_FDS_ENV
from workers.lean import defer_unused_modules, pydantic_plugins_off

__all__ = ["main"]

_SERVES = ("agent_worker", "toolhost")


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
    zygote.serve_forks(
        control,
        partial(_become_worker, serves=args.serves),
        ids=(args.worker_uid, args.worker_uid),
        linger=args.serves == "toolhost",  # a host handed to a session lives on
    )
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


def _become_worker(request: zygote.ForkRequest, fds: list[int], *, serves: str) -> int:
    """In the worker's new namespaces, with all capabilities there: finish its sandbox (the
    `read_only` mounts of a read-only tool host made so), drop them, and serve the protocol
    as `workers.agent_worker` (or `workers.toolhost`)."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    proto_in, proto_out, stderr = fds
    os.dup2(stderr, 2)
    nsfork.hide_rw_proc()
    nsfork.fresh_proc()
    nsfork.private_tmp(request.tmp_bytes)  # the zygote's are shared by every worker
    nsfork.mount_tmpfs("/dev/shm", request.tmp_bytes)
    nsfork.loopback_up()
    if request.read_only:
        nsfork.make_read_only(request.read_only)
    nsfork.drop_capabilities()
    from sandbox.seccomp import build_no_userns_filter

    program = build_no_userns_filter()
    if program is not None:
        nsfork.install_filter(program)
    nsfork.set_limits(dict(request.limits))
    nsfork.make_undumpable()
    keep = {0, 1, 2, proto_in, proto_out}
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            try:
                os.close(int(name))
            except OSError:
                pass
    os.environ[PIPE_FDS_ENV] = f"{proto_in},{proto_out}"
    if serves == "toolhost":
        from workers import toolhost

        return toolhost.main(list(request.argv))
    from workers import agent_worker

    return agent_worker.main(list(request.argv))


if __name__ == "__main__":
    sys.exit(main())
