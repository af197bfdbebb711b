"""Emptying a sandbox's private scratch file systems (`/tmp`, `/dev/shm`), from inside it.

A read-only pool worker is reused for the next subagent (workers/agent_worker.py): its
workspace cannot change, and nothing a command started outlives its call
(`sandbox.process.orphans`), but a command may leave files in the sandbox's private tmpfs
mounts, the only places it can write. The worker empties them after each run
(`empty_scratch`), so a run never finds what an earlier one left there: a planted file, a
full /tmp. When they cannot be emptied, the worker says so and the pool replaces it.

Emptying a /tmp is harmless only where that /tmp is the sandbox's own: outside a sandbox it
is the machine's, everyone's. So a worker empties only what `private_scratch` finds, at
start-up, before anything has run in it: the spawner that put it in its sandbox said so in
its environment (`PRIVATE_SCRATCH_ENV`, which nothing outside a Warren sandbox sets), it is in
a user namespace of its own, and each directory is a tmpfs mounted there. An unsandboxed
worker (`--sandbox=off`, the protocol's tests, a worker run in process) finds none and
empties nothing (tests/sandbox/test_scratch.py).

What is mounted below them (a workspace under /tmp, bound by bwrap or bound again by the
zygote's `nsfork.private_tmp`; a masked file) is another file system: never entered, never
removed, and the directories that lead to it stay. Links are never followed. Standard library
only: a worker imports it at start-up.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "MAX_DEPTH",
    "PRIVATE_SCRATCH_ENV",
    "SCRATCH",
    "SWEEP_TIME_S",
    "empty_scratch",
    "private_scratch",
]

SCRATCH: tuple[Path, ...] = (Path("/tmp"), Path("/dev/shm"))
"""The sandbox's private, writable tmpfs mounts (`sandbox.argv`, `sandbox.nsfork`)."""
PRIVATE_SCRATCH_ENV = "WARREN_PRIVATE_SCRATCH"
"""Set to "1" in a sandbox's environment by the spawner that made it (workers'
`SandboxedSpawner`, the Ray actor): its `SCRATCH` are its own (the floor mounts them in
every sandbox)."""
SWEEP_TIME_S = 2.0
"""Longest `empty_scratch` keeps removing by default before it gives up (a million files)."""
MAX_DEPTH = 256
"""Directories nested deeper than this are not emptied (each level holds a descriptor)."""
_INITIAL_UID_MAP = ["0", "0", "4294967295"]
"""/proc/self/uid_map of the machine's own user namespace."""


def private_scratch(
    environ: Mapping[str, str], *, proc: Path = Path("/proc/self")
) -> tuple[Path, ...] | str:
    """`SCRATCH`, when this process may empty them: `environ` has `PRIVATE_SCRATCH_ENV`
    set to "1", the process is not in the machine's own user namespace, and each is a
    tmpfs mount point of its own (the last mount on it, in `proc`'s mountinfo). Otherwise
    why not, for the log: then nothing is to be emptied. Never raises `OSError`."""
    if environ.get(PRIVATE_SCRATCH_ENV) != "1":
        return f"{PRIVATE_SCRATCH_ENV} is not set: not a pool worker's sandbox"
    try:
        uid_map = (proc / "uid_map").read_text().split("\n")
        mountinfo = (proc / "mountinfo").read_text().splitlines()
    except OSError as exc:
        return f"cannot read {proc}: {exc.strerror}"
    if any(line.split() == _INITIAL_UID_MAP for line in uid_map):
        return "in the machine's own user namespace: not a sandbox"
    types: dict[str, str] = {}
    for line in mountinfo:
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if len(parts) > 4 and rest:
            types[parts[4].encode().decode("unicode_escape")] = rest.split()[0]
    for directory in SCRATCH:
        if types.get(str(directory)) != "tmpfs":
            return f"{directory} is not a tmpfs mounted in this sandbox"
    return SCRATCH


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Left(Exception):
    """Something stays; the message says what and why."""


def empty_scratch(dirs: Sequence[Path], *, time_limit_s: float = SWEEP_TIME_S) -> str | None:
    """Remove everything in each of `dirs` that lies on that directory's own file system,
    keeping the directories themselves (and any that lead to a mount below them). A missing
    one is skipped. Only ever pass what `private_scratch` returned: anything else is
    someone's files.

    Blocking: call it in a thread, when nothing else in the sandbox can write there (no
    process of a run is left). Returns None once they are empty, else why not: a name that
    cannot be removed, a tree nested deeper than `MAX_DEPTH`, more than `time_limit_s`
    seconds of work. Never raises `OSError`.
    """
    deadline = time.monotonic() + time_limit_s
    for top in dirs:
        try:
            fd = os.open(top, _DIR_FLAGS)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"{top}: {exc.strerror}"
        try:
            _empty(fd, os.fstat(fd).st_dev, str(top), deadline, 0)
        except _Left as left:
            return str(left)
        finally:
            os.close(fd)
    return None


def _empty(fd: int, device: int, where: str, deadline: float, depth: int) -> None:
    """Empty the open directory `fd` (at `where`, for messages) of what is on `device`."""
    if depth > MAX_DEPTH:
        raise _Left(f"{where}: nested deeper than {MAX_DEPTH} directories")
    try:
        with os.scandir(fd) as entries:
            names = [entry.name for entry in entries]
    except OSError as exc:
        raise _Left(f"{where}: {exc.strerror}") from exc
    for name in names:
        if time.monotonic() > deadline:
            raise _Left(f"{where}: emptying took longer than the time limit")
        path = f"{where}/{name}"
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise _Left(f"{path}: {exc.strerror}") from exc
        if info.st_dev != device:
            continue  # a mount point (a workspace under /tmp): not scratch
        try:
            if not stat.S_ISDIR(info.st_mode):
                os.unlink(name, dir_fd=fd)
                continue
            if info.st_mode & stat.S_IRWXU != stat.S_IRWXU:  # a run's `chmod 0`
                os.chmod(name, stat.S_IMODE(info.st_mode) | stat.S_IRWXU, dir_fd=fd)
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            try:
                _empty(child, device, path, deadline, depth + 1)
            finally:
                os.close(child)
            os.rmdir(name, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ENOTEMPTY:
                continue  # it leads to a mount point, which stays with its way in
            raise _Left(f"{path}: {exc.strerror}") from exc
