"""A small seccomp-BPF program for the holes that namespaces and read-only mounts leave open.

Each rule answers an escape that works without it (pinned in tests/sandbox/test_escape.py):

- `socket()` only for AF_INET, AF_INET6 and AF_NETLINK (all confined by the private network
  namespace), plus AF_UNIX when the spec allows it. A Unix socket on the host stays
  connectable through a read-only bind (read-only mounts do not stop `connect()`), so a
  session bus or docker.sock in view would be a way out; AF_VSOCK is not namespaced at all.
  With `network = "host"` (an MCP server granted the network) the same families are allowed
  and no longer confined: AF_INET/AF_INET6 reach what the user reaches (the grant), AF_NETLINK
  reads the host's routes and sockets but changes nothing (no capability in the namespace's
  owner), raw and packet sockets need a capability too; AF_UNIX stays refused, and the spec
  refuses to allow it there, since the host's abstract Unix sockets live in its network
  namespace, beyond any mount.
- `chmod`/`open`/`mknod` families refuse modes with the setuid or setgid bit: otherwise a
  sandbox running as host root plants a setuid-root binary in the workspace for later.
- `ioctl(TIOCSTI)` and `ioctl(TIOCLINUX)` fail, so no keystrokes can be pushed into a
  terminal the sandbox was handed (belt and braces with bwrap's `--new-session`).
- `io_uring_*` (it performs socket and open operations that seccomp never sees), kernel
  keyrings (`keyctl`, `add_key`, `request_key`; not namespaced) and `openat2` (its mode sits
  in a struct we cannot inspect) fail with ENOSYS, so programs fall back.
- `ptrace`, `process_vm_readv`/`process_vm_writev`, `process_madvise`, `pidfd_getfd`, `kcmp`,
  `perf_event_open` and `userfaultfd` fail with EPERM: no process in a sandbox reads, writes or
  steals from another one (a worker's memory or its protocol pipe, see workers/entry.py), and
  none gets the kernel interfaces that make racing the others easier. Debuggers do not work
  inside; `strace` of a tool runs from outside.
- A syscall from another ABI (x32, or i386 via `int 0x80`) kills the process: those tables
  number things differently and would slip past every rule above.

The program is built here as bytes (no libseccomp) and handed to bwrap with `--seccomp FD`.
"""

from __future__ import annotations

import errno
import os
import platform
import struct
from dataclasses import dataclass

__all__ = ["SUPPORTED_ARCHES", "build_filter", "build_no_userns_filter", "program_fd"]

# struct seccomp_data offsets (little-endian): nr, arch, instruction pointer, args[6].
_NR = 0
_ARCH = 4


def _arg_lo(index: int) -> int:
    return 16 + 8 * index


_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06

_RET_KILL_PROCESS = 0x80000000
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000

_AF_UNIX, _AF_INET, _AF_INET6, _AF_NETLINK = 1, 2, 10, 16
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C
_SETID_BITS = 0o6000


@dataclass(frozen=True)
class _Arch:
    audit: int
    x32_bit: bool
    socket: int
    ioctl: int
    mode_args: tuple[tuple[int, int], ...]
    """(syscall number, index of its mode argument) for calls that set file modes."""
    enosys: tuple[int, ...]
    eperm: tuple[int, ...]
    """Calls refused outright: reaching into another process, or kernel help for races."""
    clone: int = 56
    unshare: int = 272


_X86_64 = _Arch(
    audit=0xC000003E,
    x32_bit=True,
    socket=41,
    ioctl=16,
    # open, creat, chmod, fchmod, mknod, openat, mknodat, fchmodat, fchmodat2
    mode_args=((2, 2), (85, 1), (90, 1), (91, 1), (133, 1), (257, 3), (259, 2), (268, 2), (452, 2)),
    # add_key, request_key, keyctl, io_uring_setup/enter/register, openat2
    enosys=(248, 249, 250, 425, 426, 427, 437),
    # ptrace, process_vm_readv/writev, kcmp, process_madvise, pidfd_getfd, perf_event_open,
    # userfaultfd
    eperm=(101, 310, 311, 312, 440, 438, 298, 323),
)
_AARCH64 = _Arch(
    audit=0xC00000B7,
    x32_bit=False,
    socket=198,
    ioctl=29,
    # mknodat, fchmod, fchmodat, openat, fchmodat2
    mode_args=((33, 2), (52, 1), (53, 2), (56, 3), (452, 2)),
    # add_key, request_key, keyctl, io_uring_setup/enter/register, openat2
    enosys=(217, 218, 219, 425, 426, 427, 437),
    # ptrace, process_vm_readv/writev, kcmp, process_madvise, pidfd_getfd, perf_event_open,
    # userfaultfd
    eperm=(117, 270, 271, 272, 440, 438, 241, 282),
    clone=220,
    unshare=97,
)

SUPPORTED_ARCHES: dict[str, _Arch] = {"x86_64": _X86_64, "aarch64": _AARCH64}
"""Machines (`platform.machine()`) we can build a filter for; elsewhere none is installed."""

_Insn = tuple[str, int, str | None, str | None]


def build_filter(*, allow_unix_sockets: bool, machine: str | None = None) -> bytes | None:
    """The filter as `struct sock_filter[]` bytes, or None on an unsupported machine."""
    arch = SUPPORTED_ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    return _assemble(_program(arch, allow_unix_sockets=allow_unix_sockets))


_CLONE_NEWUSER = 0x10000000
_CLONE3 = 435


def build_no_userns_filter(machine: str | None = None) -> bytes | None:
    """A filter stacked by a worker forked from a zygote (sandbox/nsfork.py) once its own
    namespaces exist: `unshare` and `clone` with CLONE_NEWUSER fail with EPERM, `clone3`
    (whose flags sit in a struct) with ENOSYS so programs fall back to `clone`. What bwrap's
    `--disable-userns` gives a fresh sandbox, which the zygote's sandbox cannot have (it
    makes the namespaces). None on an unsupported machine."""
    arch = SUPPORTED_ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    prog: list[_Insn | str] = [
        ("ld", _ARCH, None, None),
        ("jeq", arch.audit, None, "kill"),
        ("ld", _NR, None, None),
        ("jeq", _CLONE3, "enosys", None),
        ("jeq", arch.unshare, "flags", None),
        ("jeq", arch.clone, "flags", None),
        ("ret", _RET_ALLOW, None, None),
        "flags",
        ("ld", _arg_lo(0), None, None),
        ("jset", _CLONE_NEWUSER, "eperm", None),
        ("ret", _RET_ALLOW, None, None),
        "eperm",
        ("ret", _RET_ERRNO | errno.EPERM, None, None),
        "enosys",
        ("ret", _RET_ERRNO | errno.ENOSYS, None, None),
        "kill",
        ("ret", _RET_KILL_PROCESS, None, None),
    ]
    return _assemble(prog)


def _program(arch: _Arch, *, allow_unix_sockets: bool) -> list[_Insn | str]:
    prog: list[_Insn | str] = [
        ("ld", _ARCH, None, None),
        ("jeq", arch.audit, None, "kill"),
        ("ld", _NR, None, None),
    ]
    if arch.x32_bit:
        prog.append(("jge", 0x40000000, "kill", None))
    prog.append(("jeq", arch.socket, "socket", None))
    prog.append(("jeq", arch.ioctl, "ioctl", None))
    mode_indices = sorted({index for _, index in arch.mode_args})
    for nr, index in arch.mode_args:
        prog.append(("jeq", nr, f"mode{index}", None))
    for nr in arch.enosys:
        prog.append(("jeq", nr, "enosys", None))
    for nr in arch.eperm:
        prog.append(("jeq", nr, "eperm", None))
    prog.append(("ret", _RET_ALLOW, None, None))

    families = [_AF_INET, _AF_INET6, _AF_NETLINK] + ([_AF_UNIX] if allow_unix_sockets else [])
    prog += ["socket", ("ld", _arg_lo(0), None, None)]
    prog += [("jeq", family, "allow", None) for family in families]
    prog.append(("ret", _RET_ERRNO | errno.EPERM, None, None))

    prog += ["ioctl", ("ld", _arg_lo(1), None, None)]
    prog += [("jeq", _TIOCSTI, "eperm", None), ("jeq", _TIOCLINUX, "eperm", None)]
    prog.append(("ret", _RET_ALLOW, None, None))

    for index in mode_indices:
        prog += [f"mode{index}", ("ld", _arg_lo(index), None, None)]
        prog += [("jset", _SETID_BITS, "eperm", None), ("ret", _RET_ALLOW, None, None)]

    prog += ["allow", ("ret", _RET_ALLOW, None, None)]
    prog += ["eperm", ("ret", _RET_ERRNO | errno.EPERM, None, None)]
    prog += ["enosys", ("ret", _RET_ERRNO | errno.ENOSYS, None, None)]
    prog += ["kill", ("ret", _RET_KILL_PROCESS, None, None)]
    return prog


def _assemble(prog: list[_Insn | str]) -> bytes:
    labels: dict[str, int] = {}
    insns: list[_Insn] = []
    for item in prog:
        if isinstance(item, str):
            labels[item] = len(insns)
        else:
            insns.append(item)
    codes = {"ld": _LD_W_ABS, "jeq": _JEQ_K, "jge": _JGE_K, "jset": _JSET_K, "ret": _RET_K}
    out = bytearray()
    for pc, (op, k, true_label, false_label) in enumerate(insns):
        jt = _offset(labels, pc, true_label)
        jf = _offset(labels, pc, false_label)
        out += struct.pack("<HBBI", codes[op], jt, jf, k)
    return bytes(out)


def _offset(labels: dict[str, int], pc: int, label: str | None) -> int:
    if label is None:
        return 0
    offset = labels[label] - pc - 1
    if not 0 <= offset <= 255:
        raise AssertionError(f"seccomp jump to {label} out of range ({offset})")
    return offset


def program_fd(program: bytes) -> int:
    """A pipe's read end holding `program`, as bwrap's `--seccomp FD` reads it (small: it
    must fit the pipe buffer). The caller passes it to bwrap and closes it."""
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, program)
    finally:
        os.close(write_fd)
    return read_fd
