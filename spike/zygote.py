"""Spike zygote: runs inside bwrap (no --disable-userns, no --proc), forks sandboxed workers.

    python -I spike/zygote.py CONTROL_FD WORKER_UID WORKER_GID
"""

from __future__ import annotations

import array
import json
import os
import select
import signal
import socket
import sys

sys.path.insert(0, os.path.dirname(__file__))
import nsfork  # noqa: E402

MSG = 65536
RW_PROC = "/tmp/.proc"  # bwrap's proc (writable, with covers): only for id maps


def main() -> None:
    control_fd, worker_uid, worker_gid = (int(x) for x in sys.argv[1:4])
    uid, gid = os.getuid(), os.getgid()
    # 1. Our own user+mount namespace, only to mount a proc of the sandbox's pid namespace
    #    with nothing on top (bwrap's --proc has covers, which a nested namespace cannot mount
    #    a proc next to): then every worker's namespace sees a fully visible proc.
    #    Mounting a proc takes CAP_SYS_ADMIN over the pid namespace's owner, so the zygote
    #    proper is pid 1 of a pid namespace of its own; this process waits for it.
    nsfork.unshare(nsfork.CLONE_NEWUSER | nsfork.CLONE_NEWNS | nsfork.CLONE_NEWPID)
    nsfork.map_ids(uid, uid, gid, gid, RW_PROC)
    inner = os.fork()
    if inner:
        os.close(control_fd)
        _, status = os.waitpid(inner, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    nsfork.fresh_proc()
    nsfork.drop_capabilities()
    nsfork.prctl(nsfork.PR_SET_DUMPABLE, 0)
    # 2. Preload what a worker imports.
    from workers import agent_worker

    import gc
    import threading
    from pathlib import Path

    import trio

    async def warm() -> None:
        async def send(_: bytes) -> None:
            return None

        worker = agent_worker.AgentWorker(
            tools=agent_worker.worker_tools("read_only"), workspace=Path("/"), cwd=Path("/"),
            send=send,
        )
        await worker.rehearse()

    if os.environ.get("SPIKE_WARM") != "0":
        trio.run(warm)
    assert threading.active_count() == 1, threading.enumerate()
    gc.collect()
    gc.freeze()
    ctl = socket.socket(fileno=control_fd)
    rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wfd)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sys.stderr.write(f"zygote ready pid={os.getpid()}\n")
    sys.stderr.flush()
    ctl.send(json.dumps({"ready": os.getpid()}).encode())
    while True:
        ready, _, _ = select.select([ctl, rfd], [], [])
        if rfd in ready:
            os.read(rfd, 4096)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            ctl.send(json.dumps({"exit": pid, "status": os.waitstatus_to_exitcode(status)}).encode())
        if ctl in ready:
            fds = array.array("i")
            msg, anc, _, _ = ctl.recvmsg(MSG, socket.CMSG_SPACE(16 * fds.itemsize))
            if not msg:
                return
            for level, kind, data in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
            request = json.loads(msg)
            pid = spawn(request, list(fds), worker_uid, worker_gid, control_fd, rfd, wfd)
            for fd in fds:
                os.close(fd)
            pidfd = os.pidfd_open(pid)
            ctl.sendmsg([json.dumps({"pid": pid}).encode()],
                        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [pidfd]))])
            os.close(pidfd)


def spawn(request: dict, fds: list[int], worker_uid: int, worker_gid: int, *close: int) -> int:
    """Fork the middle process, which unshares and forks the worker (pid 1 of its own pid
    namespace) and exits; the worker is then our child (subreaper). Returns its pid."""
    report_r, report_w = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(report_r)
            for fd in close:
                os.close(fd)
            uid, gid = os.getuid(), os.getgid()
            weak = os.environ.get("SPIKE_WEAK") == "1"  # control: no pid namespace of its own
            nsfork.unshare(
                nsfork.CLONE_NEWUSER | nsfork.CLONE_NEWNS | (0 if weak else nsfork.CLONE_NEWPID)
                | nsfork.CLONE_NEWIPC | nsfork.CLONE_NEWUTS | nsfork.CLONE_NEWNET
                | nsfork.CLONE_NEWCGROUP
            )
            nsfork.map_ids(worker_uid, uid, worker_gid, gid, RW_PROC)
            worker = os.fork()
            if worker:
                os.write(report_w, str(worker).encode())
                os._exit(0)
            os.close(report_w)
            become_worker(request, fds)
        except BaseException as exc:  # noqa: BLE001
            os.write(2, f"zygote child failed: {exc!r}\n".encode())
            os._exit(127)
    os.close(report_w)
    data = os.read(report_r, 64)
    os.close(report_r)
    os.waitpid(middle, 0)
    if not data:
        raise OSError("the worker could not be forked")
    return int(data)


def become_worker(request: dict, fds: list[int]) -> None:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    nsfork.mount("tmpfs", "/tmp", "tmpfs", nsfork.MS_NOSUID | nsfork.MS_NODEV, "size=268435456")
    nsfork.mount("tmpfs", "/dev/shm", "tmpfs", nsfork.MS_NOSUID | nsfork.MS_NODEV, "size=67108864")
    if os.environ.get("SPIKE_WEAK") != "1":
        nsfork.fresh_proc()
    nsfork.loopback_up()
    nsfork.drop_capabilities()
    nsfork.install_filter(nsfork.no_new_userns_filter())
    nsfork.prctl(nsfork.PR_SET_DUMPABLE, 0)
    proto_in, proto_out, err = fds
    os.dup2(err, 2)
    keep = {0, 1, 2, proto_in, proto_out}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    os.environ["WARREN_PIPE_FDS"] = f"{proto_in},{proto_out}"
    if request.get("attack") is not None:
        import subprocess

        attacker = os.path.join(os.path.dirname(__file__), "attack.py")
        done = subprocess.run(
            [sys.executable, "-I", attacker, *map(str, request["attack"])],
            stdout=subprocess.PIPE, check=False,
        )
        os.write(proto_out, done.stdout)
        while os.read(proto_in, 4096):
            pass
        os._exit(0)
    if request.get("exec"):
        os.set_inheritable(proto_in, True)
        os.set_inheritable(proto_out, True)
        os.dup2(proto_in, 0)
        os.dup2(proto_out, 1)
        os.execv(request["exec"][0], request["exec"])
    from workers import agent_worker

    os._exit(agent_worker.main(request["argv"]))


if __name__ == "__main__":
    main()
