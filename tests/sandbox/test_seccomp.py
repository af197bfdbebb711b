"""The seccomp program, checked by running it in a small BPF interpreter (table-driven), and
once in the kernel (a sandbox that cannot create a Unix socket but can use socketpair)."""

from __future__ import annotations

import errno
import struct
from pathlib import Path

import pytest

from sandbox.host import SandboxHost
from sandbox.run import run_sandboxed
from sandbox.seccomp import SUPPORTED_ARCHES, build_filter, build_no_userns_filter
from sandbox.spec import Limits, SandboxSpec, WorkspaceRoot

ALLOW = "allow"
KILL = "kill"
X86_64 = 0xC000003E
AARCH64 = 0xC00000B7
I386 = 0x40000003


def run_bpf(program: bytes, *, arch: int, nr: int, args: tuple[int, ...] = ()) -> str:
    """Interpret the classic-BPF subset the filter uses against one seccomp_data."""
    full = (*args, *([0] * (6 - len(args))))
    data = struct.pack("<iIQ6Q", nr, arch, 0, *full)
    insns = [struct.unpack_from("<HBBI", program, i) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif code in (0x15, 0x35, 0x45):
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += 1 + (jt if taken else jf)
        elif code == 0x06:
            if k == 0x7FFF0000:
                return ALLOW
            if k == 0x80000000:
                return KILL
            assert k & 0xFFFF0000 == 0x00050000
            return errno.errorcode[k & 0xFFFF]
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")


PROGRAM = build_filter(allow_unix_sockets=False, machine="x86_64") or b""
PROGRAM_UNIX = build_filter(allow_unix_sockets=True, machine="x86_64") or b""

CASES = [
    # (description, nr, args, expected)
    ("read", 0, (), ALLOW),
    ("socket AF_INET", 41, (2, 1), ALLOW),
    ("socket AF_INET6", 41, (10, 1), ALLOW),
    ("socket AF_NETLINK", 41, (16, 3), ALLOW),
    ("socket AF_UNIX", 41, (1, 1), "EPERM"),
    ("socket AF_UNIX, junk in the high bits", 41, (1 | (1 << 40), 1), "EPERM"),
    ("socket AF_PACKET", 41, (17, 3), "EPERM"),
    ("socket AF_VSOCK", 41, (40, 1), "EPERM"),
    ("socketpair AF_UNIX", 53, (1, 1), ALLOW),
    ("ioctl TIOCSTI", 16, (0, 0x5412), "EPERM"),
    ("ioctl TIOCLINUX", 16, (0, 0x541C), "EPERM"),
    ("ioctl TCGETS", 16, (0, 0x5401), ALLOW),
    ("chmod 0755", 90, (0, 0o755), ALLOW),
    ("chmod 04755", 90, (0, 0o4755), "EPERM"),
    ("fchmod 02755", 91, (3, 0o2755), "EPERM"),
    ("fchmodat 04755", 268, (0, 0, 0o4755), "EPERM"),
    ("fchmodat2 06755", 452, (0, 0, 0o6755), "EPERM"),
    ("open O_CREAT 0644", 2, (0, 0o101, 0o644), ALLOW),
    ("open O_CREAT 04755", 2, (0, 0o101, 0o4755), "EPERM"),
    ("openat O_CREAT 04755", 257, (0, 0, 0o101, 0o4755), "EPERM"),
    ("creat 04755", 85, (0, 0o4755), "EPERM"),
    ("mknodat S_IFREG|04755", 259, (0, 0, 0o104755), "EPERM"),
    ("keyctl", 250, (), "ENOSYS"),
    ("add_key", 248, (), "ENOSYS"),
    ("io_uring_setup", 425, (), "ENOSYS"),
    ("openat2", 437, (), "ENOSYS"),
    ("x32 ABI read", 0x40000000, (), KILL),
    # Reaching into another process (a worker's memory or its protocol pipe).
    ("ptrace PTRACE_ATTACH", 101, (16, 1), "EPERM"),
    ("ptrace PTRACE_TRACEME", 101, (0,), "EPERM"),
    ("process_vm_readv", 310, (1,), "EPERM"),
    ("process_vm_writev", 311, (1,), "EPERM"),
    ("kcmp", 312, (1, 2), "EPERM"),
    ("process_madvise", 440, (3,), "EPERM"),
    ("pidfd_getfd", 438, (3, 4, 0), "EPERM"),
    ("perf_event_open", 298, (), "EPERM"),
    ("userfaultfd", 323, (), "EPERM"),
    ("pidfd_open (harmless: signals only)", 434, (1, 0), ALLOW),
    # A worker confines itself to its write scope (sandbox/landlock.py).
    ("landlock_create_ruleset", 444, (0, 0, 1), ALLOW),
    ("landlock_add_rule", 445, (3, 1, 0, 0), ALLOW),
    ("landlock_restrict_self", 446, (3, 0), ALLOW),
    ("getpid", 39, (), ALLOW),
]


@pytest.mark.parametrize(("name", "nr", "args", "expected"), CASES, ids=[c[0] for c in CASES])
def test_x86_64_decisions(name: str, nr: int, args: tuple[int, ...], expected: str) -> None:
    assert run_bpf(PROGRAM, arch=X86_64, nr=nr, args=args) == expected


def test_other_abi_is_killed() -> None:
    assert run_bpf(PROGRAM, arch=I386, nr=359, args=(1, 1)) == KILL


def test_unix_sockets_when_allowed() -> None:
    assert run_bpf(PROGRAM_UNIX, arch=X86_64, nr=41, args=(1, 1)) == ALLOW
    assert run_bpf(PROGRAM_UNIX, arch=X86_64, nr=41, args=(40, 1)) == "EPERM"


def test_aarch64_program() -> None:
    program = build_filter(allow_unix_sockets=False, machine="aarch64")
    assert program is not None
    assert run_bpf(program, arch=AARCH64, nr=198, args=(1, 1)) == "EPERM"
    assert run_bpf(program, arch=AARCH64, nr=53, args=(0, 0, 0o4755)) == "EPERM"
    assert run_bpf(program, arch=AARCH64, nr=63, args=()) == ALLOW
    for nr in (117, 270, 271, 272, 440, 438, 241, 282):  # ptrace, process_vm_*, ...
        assert run_bpf(program, arch=AARCH64, nr=nr, args=(1,)) == "EPERM", nr
    assert run_bpf(program, arch=X86_64, nr=0, args=()) == KILL


@pytest.mark.parametrize(
    ("machine", "arch", "clone", "unshare"),
    [("x86_64", X86_64, 56, 272), ("aarch64", AARCH64, 220, 97)],
)
def test_a_forked_worker_gets_no_nested_user_namespace(
    machine: str, arch: int, clone: int, unshare: int
) -> None:
    """What bwrap's --disable-userns gives a fresh sandbox, stacked by a zygote's worker
    (workers/zygote.py): CLONE_NEWUSER refused, other namespaces and plain forks allowed."""
    program = build_no_userns_filter(machine)
    assert program is not None
    newuser, newns, sigchld = 0x10000000, 0x00020000, 17
    assert run_bpf(program, arch=arch, nr=unshare, args=(newuser | newns,)) == "EPERM"
    assert run_bpf(program, arch=arch, nr=clone, args=(newuser | sigchld,)) == "EPERM"
    assert run_bpf(program, arch=arch, nr=435, args=(0,)) == "ENOSYS"  # clone3: a struct
    assert run_bpf(program, arch=arch, nr=unshare, args=(newns,)) == ALLOW
    assert run_bpf(program, arch=arch, nr=clone, args=(sigchld,)) == ALLOW
    assert run_bpf(program, arch=I386 if machine == "x86_64" else X86_64, nr=1) == KILL


def test_unsupported_machine_gets_no_filter() -> None:
    assert "riscv64" not in SUPPORTED_ARCHES
    assert build_filter(allow_unix_sockets=False, machine="riscv64") is None


async def test_kernel_applies_it(host: SandboxHost, scratch: Path) -> None:
    if not host.seccomp_supported:
        pytest.skip("no filter for this machine")
    script = (
        "import socket\n"
        "a, b = socket.socketpair()\n"
        "a.send(b'pair-ok')\n"
        "print(b.recv(10).decode())\n"
        "try:\n"
        "    socket.socket(socket.AF_UNIX)\n"
        "except PermissionError:\n"
        "    print('unix-refused')\n"
    )
    spec = SandboxSpec(workspaces=(WorkspaceRoot(path=scratch, mode="ro"),))
    result = await run_sandboxed(spec, ["python3", "-I", "-S", "-c", script], host=host)
    assert result.stdout.decode().split() == ["pair-ok", "unix-refused"], result


async def test_kernel_refuses_reaching_into_another_process(
    host: SandboxHost, scratch: Path
) -> None:
    """Inside a sandbox, a child tries ptrace and process_vm_readv on its own parent (same
    uid, so only the filter stands in the way of process_vm_readv on a dumpable target)."""
    if not host.seccomp_supported:
        pytest.skip("no filter for this machine")
    script = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "secret = ctypes.create_string_buffer(b'parent-secret')\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    parent = os.getppid()\n"
        "    out = []\n"
        "    r = libc.ptrace(0x4206, parent, None, None)\n"  # PTRACE_SEIZE: does not stop it
        "    out.append(f'ptrace={r}/{ctypes.get_errno()}')\n"
        "    class iovec(ctypes.Structure):\n"
        "        _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]\n"
        "    buf = ctypes.create_string_buffer(64)\n"
        "    local = iovec(ctypes.cast(buf, ctypes.c_void_p), 13)\n"
        "    remote = iovec(ctypes.cast(secret, ctypes.c_void_p), 13)\n"
        "    libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong,\n"
        "        ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]\n"
        "    r = libc.process_vm_readv(\n"
        "        parent, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)\n"
        "    out.append(f'vm_readv={r}/{ctypes.get_errno()}/{buf.value!r}')\n"
        "    print(' '.join(out), flush=True)\n"
        "    os._exit(0)\n"
        "os.waitpid(child, 0)\n"
    )
    spec = SandboxSpec(
        workspaces=(WorkspaceRoot(path=scratch, mode="ro"),), limits=Limits(wall_time_s=30.0)
    )
    result = await run_sandboxed(spec, ["python3", "-I", "-S", "-c", script], host=host)
    eperm = errno.EPERM
    assert result.stdout.decode().split() == [f"ptrace=-1/{eperm}", f"vm_readv=-1/{eperm}/b''"], (
        result
    )
