"""Spike attacker: runs as a tool of a forked worker; tries to reach the pids it is given.

Prints one JSON line: what succeeded (it should be nothing outside its own namespace)."""

import ctypes
import json
import os
import signal
import sys

libc = ctypes.CDLL(None, use_errno=True)
targets = [int(x) for x in sys.argv[1:]]
own = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
out: dict[str, object] = {"own_pids": own, "me": os.getpid(), "uid": os.getuid()}
hits: list[str] = []


class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def attempt(pid: int) -> None:
    for what, fn in (
        ("ptrace_attach", lambda: libc.syscall(101, 16, pid, 0, 0)),
        ("ptrace_seize", lambda: libc.syscall(101, 0x4206, pid, 0, 0)),
    ):
        if fn() == 0:
            hits.append(f"{what} {pid}")
    buf = ctypes.create_string_buffer(64)
    local = Iovec(ctypes.cast(buf, ctypes.c_void_p), 64)
    remote = Iovec(0x400000, 64)
    if libc.syscall(310, pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) > 0:
        hits.append(f"process_vm_readv {pid}")
    for name in ("mem", "environ", "maps"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                if name == "mem":
                    f.seek(0x400000)
                if f.read(64):
                    hits.append(f"read /proc/{pid}/{name}")
        except OSError:
            pass


mine = {os.getpid(), os.getppid()}  # this tool and the worker it runs under
for pid in sorted(set(targets) | set(own)):
    if pid in mine:
        continue
    attempt(pid)
    try:
        os.kill(pid, signal.SIGKILL)
        hits.append(f"kill {pid}")
    except OSError:
        pass
# the worker this tool runs under: non-dumpable, so its memory is out of reach
attempt(os.getppid())
if libc.unshare(0x10000000) == 0:
    hits.append("unshare(CLONE_NEWUSER)")
if libc.mount(b"none", b"/mnt", b"tmpfs", 0, None) == 0:
    hits.append("mount")
for path in ("/tmp/.proc", "/run/zproc"):
    if os.path.exists(path):
        hits.append(f"sees {path}")
out["hits"] = hits
print(json.dumps(out), flush=True)
