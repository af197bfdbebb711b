"""Landlock: a process narrowing its own write access, enforced by the kernel, unprivileged.

A scoped writer (issue 17) may write only beneath its scope directories. The worker pool holds
it there in one of two ways, both enforced by the kernel (workers/pool.py says which applies):

- mounts: a fresh worker whose bwrap binds the workspace read-only and only the scope
  writable (workers/toolhost_runner.py, `SandboxedSpawner.spec_for`); every dispatch pays a
  cold Python start;
- Landlock (this module): a warm worker, started with the workspace writable like any writer,
  restricts itself with `restrict_writes` before it runs anything the model controls. The
  restriction holds for the process and every child it starts (Bash), cannot be lifted, and
  needs no privilege, only no_new_privs (which bwrap sets; set here too when missing).

Only write-type rights are handled (writing, truncating, removing, making and linking or
renaming files, device ioctls), so reads stay exactly as the floor's mounts say. They are
granted beneath the scope directories, the sandbox's private `/tmp` and `/dev/shm`, and, for
writing and ioctls only, beneath `/dev` (`/dev/null`, a terminal). Everything else gets
EACCES; a rename or hard link that would move a file across that boundary gets EXDEV
(`LANDLOCK_ACCESS_FS_REFER`, ABI 2, the reason 2 is the least ABI used). The rules hold on
inodes, so `..`, symlinks and `/proc/self/root/...` reach the same verdicts
(tests/workers/test_scoped_writers_e2e.py runs the attacks under both mechanisms).

Landlock restricts the calling thread (and what it starts later): `restrict_writes` refuses
unless the caller is its process's only thread and has no child process, so nothing that
already exists escapes the restriction. A rule holds for everything beneath its directory,
mounts included: a workspace bound beneath `/tmp` would be writable through the `/tmp` rule,
so `restrict_writes` also refuses when a writable mount lies beneath a scratch directory (the
pool then mounts the scope instead; it does not even try for a root beneath one,
`beneath_scratch`). The syscalls are reached through `sandbox.libc`;
the floor's seccomp program leaves them allowed (tests/sandbox/test_seccomp.py).
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import struct
from collections.abc import Sequence
from pathlib import Path

from sandbox.libc import libc

__all__ = ["MIN_ABI", "SCRATCH", "abi", "beneath_scratch", "restrict_writes", "write_rights"]

MIN_ABI = 2
"""The least Landlock ABI `restrict_writes` uses: ABI 2 brought `REFER`, without which a
rename or hard link could move a file out of a scope or into it."""

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS, _PR_GET_NO_NEW_PRIVS = 38, 39

_WRITE_FILE = 1 << 1
_REMOVE_DIR, _REMOVE_FILE = 1 << 4, 1 << 5
_MAKE_CHAR, _MAKE_DIR, _MAKE_REG, _MAKE_SOCK = 1 << 6, 1 << 7, 1 << 8, 1 << 9
_MAKE_FIFO, _MAKE_BLOCK, _MAKE_SYM = 1 << 10, 1 << 11, 1 << 12
_REFER = 1 << 13  # ABI 2
_TRUNCATE = 1 << 14  # ABI 3
_IOCTL_DEV = 1 << 15  # ABI 5

_BY_ABI = {
    1: _WRITE_FILE
    | _REMOVE_DIR
    | _REMOVE_FILE
    | _MAKE_CHAR
    | _MAKE_DIR
    | _MAKE_REG
    | _MAKE_SOCK
    | _MAKE_FIFO
    | _MAKE_BLOCK
    | _MAKE_SYM,
    2: _REFER,
    3: _TRUNCATE,
    5: _IOCTL_DEV,
}
_DEVICE_RIGHTS = _WRITE_FILE | _TRUNCATE | _IOCTL_DEV
"""Beneath `/dev`: writing to the nodes there (`> /dev/null` truncates) and their ioctls."""

SCRATCH = (Path("/tmp"), Path("/dev/shm"))
"""The sandbox's private scratch directories (tmpfs), writable beneath in a confined worker."""

_RULESET_ATTR = struct.Struct("=Q")  # struct landlock_ruleset_attr's first field is enough
_PATH_BENEATH_ATTR = struct.Struct("=Qi")  # packed: allowed_access, parent_fd


@functools.cache
def abi() -> int:
    """The kernel's Landlock ABI version; 0 when it has none (or it is disabled)."""
    version = _syscall(_SYS_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION)
    return max(version, 0)


def write_rights(version: int) -> int:
    """The write-type access rights Landlock ABI `version` knows (the ones handled)."""
    return functools.reduce(int.__or__, (r for v, r in _BY_ABI.items() if v <= version), 0)


def restrict_writes(
    writable: Sequence[Path],
    *,
    scratch: Sequence[Path] = SCRATCH,
    devices: Path | None = Path("/dev"),
) -> int:
    """Restrict this process (and every process it starts from now on) to writing beneath
    `writable` and `scratch` (every path an absolute directory without symlinks; a scratch
    directory that does not exist is skipped) and, for writing and ioctls only, beneath
    `devices`. Irreversible. Returns the ABI version used.

    **Errors:** `OSError` with a message saying what failed, and nothing is restricted when
    the kernel has no Landlock of at least `MIN_ABI`, the caller is not its process's only
    thread or has children, a writable mount lies beneath a scratch directory, a writable
    directory cannot be opened or is not where its name says (a symlink on the way), or a
    call fails.
    """
    version = abi()
    if version < MIN_ABI:
        raise OSError(f"the kernel has no Landlock ABI {MIN_ABI} or later (it has {version})")
    _check_alone()
    _check_scratch(scratch)
    handled = write_rights(version)
    rules = [(Path(p), handled, True) for p in writable]
    rules += [(p, handled, False) for p in scratch]
    if devices is not None:
        rules.append((devices, handled & _DEVICE_RIGHTS, False))
    ruleset = _syscall(_SYS_CREATE_RULESET, _RULESET_ATTR.pack(handled), _RULESET_ATTR.size, 0)
    if ruleset < 0:
        raise _error("landlock_create_ruleset")
    try:
        for path, rights, required in rules:
            _add_rule(ruleset, path, rights, required=required)
        if libc().prctl(_PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1 and (
            libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
        ):
            raise _error("prctl(PR_SET_NO_NEW_PRIVS)")
        if _syscall(_SYS_RESTRICT_SELF, ruleset, 0) != 0:
            raise _error("landlock_restrict_self")
    finally:
        os.close(ruleset)
    return version


def _add_rule(ruleset: int, path: Path, rights: int, *, required: bool) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if not required and exc.errno == 2:  # ENOENT: no such scratch directory here
            return
        raise OSError(exc.errno, f"cannot open {path}: {exc.strerror}") from exc
    try:
        if os.readlink(f"/proc/self/fd/{fd}") != str(path):
            raise OSError(f"{path} is not where its name says (a symlink on the way)")
        attr = _PATH_BENEATH_ATTR.pack(rights, fd)
        if _syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, attr, 0) != 0:
            raise _error(f"landlock_add_rule({path})")
    finally:
        os.close(fd)


def _check_alone() -> None:
    """Landlock restricts the calling thread only: any other thread, or a child started
    before, would keep writing where it liked."""
    tasks = os.listdir("/proc/self/task")
    if len(tasks) != 1:
        raise OSError(f"the process has {len(tasks)} threads; Landlock would bind only one")
    if Path(f"/proc/self/task/{tasks[0]}/children").read_text().split():
        raise OSError("the process has children that Landlock would not bind")


def beneath_scratch(path: Path) -> bool:
    """Whether `path` lies in or beneath a scratch directory (`SCRATCH`): a writable root
    there would be writable through the scratch directory's rule."""
    return any(path == s or s in path.parents for s in SCRATCH)


def _check_scratch(scratch: Sequence[Path]) -> None:
    for mount_point, options in _mounts():
        for directory in scratch:
            if directory in mount_point.parents and "rw" in options:
                raise OSError(
                    f"{mount_point} is mounted writable beneath {directory}: the rule for "
                    f"{directory} would let it be written"
                )


def _mounts() -> list[tuple[Path, set[str]]]:
    """(mount point, per-mount options) of every mount this process sees."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        found.append((Path(point), set(fields[5].split(","))))
    return found


def _syscall(number: int, *args: int | bytes | None) -> int:
    call = libc().syscall
    call.restype = ctypes.c_long
    wide = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]  # long, as declared
    return int(call(ctypes.c_long(number), *wide))


def _error(what: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what} failed: {os.strerror(err)}")
