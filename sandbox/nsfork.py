"""The steps that put a forked process into namespaces of its own (a zygote's worker).

A pool worker forked from a zygote (workers/zygote.py) does by hand, inside the zygote's
bwrap sandbox, what bwrap does for a fresh worker: a user, pid, mount, IPC, UTS, network and
cgroup namespace of its own, a proc of its own pid namespace, a private /tmp and /dev/shm, no
capabilities, no nested user namespaces, its rlimits. Stdlib and ctypes only: the zygote
imports this before anything else, and each forked worker runs it between fork and serving.

Kernel rules that shape it (each found the hard way, see workers/README.md "Zygote"):

- A nested user namespace may map its creator's uid only when that uid is not 0 (mapping 0
  needs CAP_SETFCAP over the parent): as host root the zygote's sandbox runs as uid
  `NESTED_UID` (still host root outside), and each worker maps its own 0 onto it.
- A user namespace may mount a proc only while some proc in its mount namespace is fully
  visible (nothing mounted on top) and only read-only if that one is: bwrap's `--proc` has
  covers, so the zygote's sandbox gets it at `RW_PROC` (used only to write id maps) and the
  host's read-only proc stays at /proc, on which the zygote mounts its own read-only proc.
- Mounting a proc takes CAP_SYS_ADMIN over the pid namespace's owner: the zygote and each
  worker are pid 1 of a pid namespace created with their user namespace.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import resource
import socket
import struct
from collections.abc import Iterable

__all__ = [
    "CLONE_NEWCGROUP",
    "CLONE_NEWIPC",
    "CLONE_NEWNET",
    "CLONE_NEWNS",
    "CLONE_NEWPID",
    "CLONE_NEWUSER",
    "CLONE_NEWUTS",
    "NESTED_UID",
    "RW_PROC",
    "drop_capabilities",
    "fresh_proc",
    "hide_rw_proc",
    "install_filter",
    "loopback_up",
    "make_read_only",
    "make_undumpable",
    "map_ids",
    "mount_tmpfs",
    "private_tmp",
    "set_limits",
    "unshare",
]

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

NESTED_UID = 1000
"""The zygote sandbox's uid when the host user is root (see the module docstring)."""

RW_PROC = "/dev/.proc"
"""Where the zygote's sandbox has bwrap's (writable, covered) proc: id maps are written there.
In bwrap's own /dev, where no bind of the host's can land; each worker hides it
(`hide_rw_proc`): it shows the zygote's pid namespace."""

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_BIND, _MS_REC = 0x1000, 0x4000
_PR_SET_DUMPABLE = 4
_PR_SET_SECCOMP = 22
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_MODE_FILTER = 2
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91}
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_SIOCSIFFLAGS = 0x8914
_IFF_UP, _IFF_RUNNING = 0x1, 0x40


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def unshare(flags: int) -> None:
    """unshare(2). **Errors:** `OSError` (EPERM where user namespaces are refused)."""
    _check(_libc().unshare(flags), f"unshare({flags:#x})")


def map_ids(inside: tuple[int, int], outside: tuple[int, int], *, proc: str) -> None:
    """Map this process's new user namespace: one uid and one gid (`inside` -> `outside`,
    (uid, gid) each), through the proc at `proc`; needs no privilege."""
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{inside[0]} {outside[0]} 1"),
        ("gid_map", f"{inside[1]} {outside[1]} 1"),
    ):
        with open(f"{proc}/self/{name}", "w") as f:
            f.write(text)


def _mount(source: str, target: str, fstype: str, flags: int, data: str | None = None) -> None:
    _check(
        _libc().mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {fstype} on {target}",
    )


def fresh_proc() -> None:
    """A proc of our own pid namespace over /proc, read-only (see the module docstring)."""
    _mount("proc", "/proc", "proc", _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)


def mount_tmpfs(target: str, size_bytes: int | None) -> None:
    """A private tmpfs (a worker's /tmp and /dev/shm: the zygote's are shared)."""
    data = None if size_bytes is None else f"size={size_bytes}"
    _mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, data)


def private_tmp(size_bytes: int | None) -> None:
    """A fresh tmpfs over /tmp that keeps the binds the zygote's sandbox has under it (a
    workspace under /tmp, the floor's masks inside it): each is bound again, with all its
    submounts and flags, from a descriptor opened before /tmp is covered. Call with a proc of
    our own at /proc (the binds go through `/proc/self/fd`)."""
    top = _mounts_on("/tmp")
    held = {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path in top}
    try:
        mount_tmpfs("/tmp", size_bytes)
        for path, fd in held.items():
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.makedirs(path, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600))
            _mount(f"/proc/self/fd/{fd}", path, "", _MS_BIND | _MS_REC)
    finally:
        for fd in held.values():
            os.close(fd)


def _mounts_on(target: str) -> list[str]:
    """Mount points whose parent is the topmost mount at `target` (from our mountinfo)."""
    rows = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")
            rows.append((fields[0], fields[1], point))
    ids = [mount_id for mount_id, _, point in rows if point == target]
    if not ids:
        return []
    return [point for _, parent, point in rows if parent == ids[-1] and point != target]


_SYS_MOUNT_SETATTR = 442  # the same number on every architecture (a newer, shared syscall)
_AT_FDCWD = -100
_AT_SYMLINK_NOFOLLOW = 0x100
_AT_RECURSIVE = 0x8000
_MOUNT_ATTR_RDONLY = 0x1


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def make_read_only(paths: Iterable[str]) -> None:
    """Make the mount at each of `paths`, and every mount below it, read-only in our mount
    namespace (mount_setattr with AT_RECURSIVE): a read-only tool host forked from a
    template made for the read-write one (workers/zygote.py). Adding the flag needs
    CAP_SYS_ADMIN in the namespace's user namespace only; clearing it again is refused to a
    process without it, and for mounts copied from a more privileged namespace even with it.
    Then checks each path is read-only (statvfs).

    **Errors:** `OSError` when a path is not a mount point or stays writable."""
    attr = _MountAttr(attr_set=_MOUNT_ATTR_RDONLY)
    libc = _libc()
    for path in paths:
        _check(
            libc.syscall(
                _SYS_MOUNT_SETATTR,
                ctypes.c_int(_AT_FDCWD),
                path.encode(),
                ctypes.c_uint(_AT_RECURSIVE | _AT_SYMLINK_NOFOLLOW),
                ctypes.byref(attr),
                ctypes.c_size_t(ctypes.sizeof(attr)),
            ),
            f"mount_setattr read-only {path}",
        )
        if not os.statvfs(path).f_flag & os.ST_RDONLY:
            raise OSError(f"{path} is still writable")


def hide_rw_proc() -> None:
    """An empty read-only tmpfs over `RW_PROC` (a worker must not see the zygote's pids)."""
    _mount("tmpfs", RW_PROC, "tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "size=4096")


def loopback_up() -> None:
    """Bring `lo` up in a new network namespace (bwrap does the same)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", _IFF_UP | _IFF_RUNNING))


def drop_capabilities() -> None:
    """Empty the bounding set (so executing a program as uid 0 gains nothing), then every
    other set: bwrap's `--cap-drop ALL`, for a process that just got them all from its new
    user namespace."""
    libc = _libc()
    for cap in range(64):
        if libc.prctl(_PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) < 0:
            if ctypes.get_errno() == errno.EINVAL:
                break
            _check(-1, f"PR_CAPBSET_DROP {cap}")
    header = struct.pack("II", _LINUX_CAPABILITY_VERSION_3, 0)
    _check(libc.syscall(_SYS_CAPSET[os.uname().machine], header, bytes(24)), "capset")


def install_filter(program: bytes) -> None:
    """Stack a seccomp filter (`struct sock_filter[]` bytes) on the ones already installed."""
    libc = _libc()
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), 0, 0, 0), "no_new_privs")
    buf = ctypes.create_string_buffer(program, len(program))

    class _SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = _SockFprog(len(program) // 8, ctypes.addressof(buf))
    _check(
        libc.prctl(_PR_SET_SECCOMP, ctypes.c_ulong(_SECCOMP_MODE_FILTER), ctypes.byref(prog), 0, 0),
        "seccomp",
    )


def make_undumpable() -> None:
    """Clear this process's dumpable flag (prctl PR_SET_DUMPABLE 0).

    The kernel then lets only a process with CAP_SYS_PTRACE over our user namespace ptrace us
    or open our `/proc/<pid>/{mem,fd,environ,maps,...}`; the sandbox drops every capability,
    so the tools we spawn (which exec, and so become dumpable themselves) cannot reach us. The
    coordinator, outside the sandbox's user namespace, still can. Raises `OSError` when the
    call fails: a process that cannot protect itself must not serve.
    """
    _check(_libc().prctl(_PR_SET_DUMPABLE, ctypes.c_ulong(0), 0, 0, 0), "PR_SET_DUMPABLE")


_RLIMITS = {
    "memory_bytes": resource.RLIMIT_AS,
    "processes": resource.RLIMIT_NPROC,
    "file_size_bytes": resource.RLIMIT_FSIZE,
    "open_files": resource.RLIMIT_NOFILE,
}


def set_limits(limits: dict[str, int | None]) -> None:
    """What `prlimit` gives a fresh sandbox (`sandbox.argv.prlimit_argv`): soft = hard, CPU
    with one second more hard, no core dumps. Set in the worker itself, after its user
    namespace exists, so RLIMIT_NPROC counts its own processes only."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for name, which in _RLIMITS.items():
        value = limits.get(name)
        if value is not None:
            resource.setrlimit(which, (value, value))
    cpu = limits.get("cpu_time_s")
    if cpu is not None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
