"""Spike: the namespace steps of a zygote and of a worker forked from it (stdlib + ctypes)."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REC = 0x4000
MS_PRIVATE = 1 << 18

PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), f"unshare({flags:#x})")


def mount(source: str, target: str, fstype: str, flags: int, data: str | None = None) -> None:
    _check(
        _libc.mount(
            source.encode(), target.encode(), fstype.encode() if fstype else None,
            ctypes.c_ulong(flags), data.encode() if data else None,
        ),
        f"mount {fstype} on {target}",
    )


def prctl(option: int, arg: int = 0) -> int:
    return _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


def map_ids(
    inside_uid: int, outside_uid: int, inside_gid: int, outside_gid: int, proc: str
) -> None:
    """This process's own new user namespace: one uid and one gid (no privilege needed)."""
    with open(f"{proc}/self/setgroups", "w") as f:
        f.write("deny")
    with open(f"{proc}/self/uid_map", "w") as f:
        f.write(f"{inside_uid} {outside_uid} 1")
    with open(f"{proc}/self/gid_map", "w") as f:
        f.write(f"{inside_gid} {outside_gid} 1")


def fresh_proc() -> None:
    """A proc of our pid namespace over /proc, read-only (the only proc the kernel lets a
    user namespace mount is no more writable than the one it can already see)."""
    mount("proc", "/proc", "proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)


def drop_capabilities() -> None:
    """Empty the bounding set, then every set (bwrap's --cap-drop ALL, done by hand)."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) < 0:
            if ctypes.get_errno() == errno.EINVAL:
                break
            raise OSError(ctypes.get_errno(), f"PR_CAPBSET_DROP {cap}")
    header = struct.pack("II", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = bytes(24)
    _check(_libc.syscall(126, header, data), "capset")  # x86_64 capset


def loopback_up() -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", 0x1 | 0x40))  # SIOCSIFFLAGS
    finally:
        s.close()


def install_filter(program: bytes) -> None:
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    buf = ctypes.create_string_buffer(program)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(len(program) // 8, ctypes.addressof(buf))
    _check(
        _libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(prog), 0, 0),
        "seccomp",
    )


def no_new_userns_filter() -> bytes:
    """unshare/clone with CLONE_NEWUSER -> EPERM; clone3 -> ENOSYS (glibc falls back to
    clone); what bwrap's --disable-userns gives, as a filter stacked on the floor's."""
    ld_nr = struct.pack("<HBBI", 0x20, 0, 0, 0)
    ld_arg0 = struct.pack("<HBBI", 0x20, 0, 0, 16)
    allow = struct.pack("<HBBI", 0x06, 0, 0, 0x7FFF0000)
    eperm = struct.pack("<HBBI", 0x06, 0, 0, 0x00050000 | errno.EPERM)
    enosys = struct.pack("<HBBI", 0x06, 0, 0, 0x00050000 | errno.ENOSYS)

    def jeq(k: int, jt: int, jf: int) -> bytes:
        return struct.pack("<HBBI", 0x15, jt, jf, k)

    def jset(k: int, jt: int, jf: int) -> bytes:
        return struct.pack("<HBBI", 0x45, jt, jf, k)

    return b"".join([
        ld_nr,  # 0
        jeq(435, 5, 0),  # 1 clone3 -> 7 enosys
        jeq(272, 1, 0),  # 2 unshare -> 4
        jeq(56, 0, 2),  # 3 clone -> 4, else 6 allow
        ld_arg0,  # 4
        jset(CLONE_NEWUSER, 2, 0),  # 5 -> 8 eperm
        allow,  # 6
        enosys,  # 7
        eperm,  # 8
    ])
