"""Legacy host stubs: sweeping the placeholders that older Warren versions left behind.

Warren used to mask a missing protected path (`.envrc`, `.git/hooks`) by creating an empty
directory or small file there and binding it read-only; the user's tree showed them while a
sandbox ran, and after a crash until the next sweep. Missing protected paths are now watched
instead (`sandbox.guard`), and nothing creates stubs any more, but the registry format stays so
`sweep()` can remove what an older version left: every sandbox start sweeps once per process.

Concurrent sandboxes (in this process or others) share stubs through a registry: one JSON
state file under a lock (`flock`), recording for each stub whether we created it, its inode,
and its holders (pid, process start time, a random token). A holder whose process is gone is
dropped, so a crash leaks a stub only until the next sandbox touches it or `sweep()` runs.
A stub is removed only if we created it, it is still the same inode and still empty: content
a user put there in the meantime is never deleted.

The registry lives in Warren's state directory, which every sandbox has masked.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["StubLease", "StubRegistry", "StubRequest"]


class StubRequest(BaseModel):
    """A host placeholder in the registry's format (only tests and old versions create them)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: Path
    kind: Literal["dir", "file"]
    content: str = ""


@dataclass(frozen=True)
class StubLease:
    """What `acquire` handed out; give it back to `release`."""

    token: str
    paths: tuple[Path, ...]


class StubRegistry:
    """Creates, shares and removes host stubs. Methods block briefly on a file lock: call
    them from a worker thread in async code."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def acquire(self, stubs: Sequence[StubRequest]) -> StubLease:
        """Make every stub exist and record us as a holder.

        Errors: `OSError` when a stub cannot be created (its parent vanished or became a
        symlink); stubs created before the failure are released again.
        """
        token = f"{os.getpid()}:{_start_time(os.getpid())}:{uuid.uuid4().hex}"
        if not stubs:
            return StubLease(token=token, paths=())
        done: list[Path] = []
        with self._state() as state:
            try:
                for stub in stubs:
                    self._hold(state, stub, token)
                    done.append(stub.path)
            except OSError:
                self._drop(state, done, token)
                raise
        return StubLease(token=token, paths=tuple(done))

    def release(self, lease: StubLease) -> None:
        """Drop our hold; remove each stub nobody holds any more (if still ours and empty)."""
        if not lease.paths:
            return
        with self._state() as state:
            self._drop(state, list(lease.paths), lease.token)

    def sweep(self) -> list[Path]:
        """Drop holders whose process is gone and remove their orphaned stubs. Returns the
        stubs removed (the doctor calls this)."""
        removed: list[Path] = []
        with self._state() as state:
            for key in list(state):
                record = state[key]
                record["holders"] = [h for h in record["holders"] if _alive(h)]
                if not record["holders"]:
                    if _remove_if_ours(Path(key), record):
                        removed.append(Path(key))
                    del state[key]
        return removed

    # -- internals -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock_fd = os.open(self.directory / "stubs.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            path = self.directory / "stubs.json"
            try:
                state: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                state = {}
            yield state
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(state, indent=1, sort_keys=True), encoding="utf-8")
            tmp.replace(path)
        finally:
            os.close(lock_fd)

    def _hold(self, state: dict[str, Any], stub: StubRequest, token: str) -> None:
        key = str(stub.path)
        record = state.get(key)
        if record is not None:
            record["holders"] = [h for h in record["holders"] if _alive(h)]
            if not _same_inode(stub.path, record):
                record = None
        if record is None:
            if os.path.lexists(stub.path):
                info = os.lstat(stub.path)
                record = {"owned": False, "dev": info.st_dev, "ino": info.st_ino}
            else:
                info = _create(stub)
                record = {
                    "owned": True,
                    "kind": stub.kind,
                    "content": stub.content,
                    "dev": info.st_dev,
                    "ino": info.st_ino,
                }
            record["holders"] = [h for h in (state.get(key) or {}).get("holders", [])]
            state[key] = record
        record["holders"].append(token)

    def _drop(self, state: dict[str, Any], paths: list[Path], token: str) -> None:
        for path in paths:
            record = state.get(str(path))
            if record is None:
                continue
            record["holders"] = [h for h in record["holders"] if h != token and _alive(h)]
            if not record["holders"]:
                _remove_if_ours(path, record)
                del state[str(path)]


def _create(stub: StubRequest) -> os.stat_result:
    """Create the stub without following a symlink anywhere on the way (a concurrent sandbox
    must not be able to turn a parent into a link and have us create the stub elsewhere)."""
    parent_fd = _open_dir_nofollow(stub.path.parent)
    try:
        name = stub.path.name
        if stub.kind == "dir":
            os.mkdir(name, 0o755, dir_fd=parent_fd)
            return os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        fd = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=parent_fd
        )
        try:
            os.write(fd, stub.content.encode())
            return os.fstat(fd)
        finally:
            os.close(fd)
    finally:
        os.close(parent_fd)


def _open_dir_nofollow(path: Path) -> int:
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in path.parts[1:]:
            next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = next_fd
    except OSError:
        os.close(fd)
        raise
    return fd


def _same_inode(path: Path, record: dict[str, Any]) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return bool(info.st_dev == record["dev"] and info.st_ino == record["ino"])


def _remove_if_ours(path: Path, record: dict[str, Any]) -> bool:
    if not record.get("owned") or not _same_inode(path, record):
        return False
    try:
        if record.get("kind") == "dir":
            os.rmdir(path)  # fails (and we keep it) unless still empty
        else:
            if path.read_bytes() != str(record.get("content", "")).encode():
                return False
            path.unlink()
    except OSError:
        return False
    return True


def _start_time(pid: int) -> str:
    """Field 22 of /proc/PID/stat (start time in clock ticks): tells a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?"
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(holder: str) -> bool:
    pid_text, start, _ = holder.split(":", 2)
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    return _start_time(pid) == start
