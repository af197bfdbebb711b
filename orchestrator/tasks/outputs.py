"""Where background tasks' output goes: one bounded file per task, in a directory that every
sandbox of the session sees read-only.

The coordinator writes the files (a background command's bytes arrive over the tool host's
protocol); no sandbox can write them, so a command cannot forge another task's output, and
none can fill the disk: past `[limits] task_output_bytes` a file starts again from a line
saying how much was dropped (`tail -f` notices the truncation and reads on from there).

The directory is per user and workspace, `/tmp/warren-<uid>/<workspace>-<hash>/tasks`, so the
sandboxes of every session of a workspace bind the same path (the warm server's spare tool
hosts, started before a session knows its id, match the session's recipe); each session's
files are in a directory of its own below it (`<session id>/<task id>.output`), removed when
the session ends. Every sandbox has a private `/tmp`: the directory is bound into it at the
same path (`SessionPolicy.sandbox_spec`), so the path the model is told is the path it reads.

The directories are made without following links and checked: owned by us, mode 0700. A
`/tmp/warren-<uid>` that another user made, or a link, is refused (`TaskOutputError`), and
background shells are then not offered.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = ["OutputFile", "TaskOutputError", "TaskOutputs", "outputs_root"]

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


class TaskOutputError(Exception):
    """The output directory cannot be made safely; the message says why."""


def outputs_root(workspace: Path, *, base: Path = Path("/tmp")) -> Path:
    """The workspace's output directory (made by `TaskOutputs.open`, not here)."""
    resolved = str(workspace.resolve())
    name = _SAFE.sub("-", workspace.name)[:40] or "root"
    digest = hashlib.sha256(resolved.encode()).hexdigest()[:12]
    return base / f"warren-{os.getuid()}" / f"{name}-{digest}" / "tasks"


class TaskOutputs:
    """The output directory of one session's tasks."""

    def __init__(self, root: Path, session_id: str, *, limit_bytes: int) -> None:
        """`root`: the workspace's directory (`outputs_root`); `limit_bytes`: the most one
        file holds at once."""
        self.root = root
        self.session_dir = root / _SAFE.sub("-", session_id)
        self.limit_bytes = limit_bytes
        self._owner: _OwnerLock | None = None

    @classmethod
    def open(
        cls, workspace: Path, session_id: str, *, limit_bytes: int, base: Path = Path("/tmp")
    ) -> TaskOutputs:
        """Make (or check) the workspace's directory, ready to bind into sandboxes; hold
        this session's lock until `remove`, and remove what sessions whose process is gone
        left (`base`: where `warren-<uid>` is, `/tmp`).

        **Errors:** `TaskOutputError` when a part of it is not ours, is a link, or is open to
        others, or it cannot be made.
        """
        root = outputs_root(workspace, base=base)
        _make_private(root)
        owners = _owners_dir(root)
        _make_private(owners)
        outputs = cls(root, session_id, limit_bytes=limit_bytes)
        outputs._owner = _OwnerLock.take(owners / f"{outputs.session_dir.name}.lock")
        _remove_unowned(root, owners)
        return outputs

    def path(self, task_id: str) -> Path:
        return self.session_dir / f"{_SAFE.sub('-', task_id)}.output"

    def create(self, task_id: str) -> OutputFile:
        """A new, empty output file for `task_id`.

        **Errors:** `OSError` when it cannot be made (it already exists: ids are unique).
        """
        _make_private(self.session_dir)
        path = self.path(task_id)
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        return OutputFile(path, fd, self.limit_bytes)

    def remove(self) -> None:
        """Remove this session's files (its end), then its lock."""
        shutil.rmtree(self.session_dir, ignore_errors=True)
        if self._owner is not None:
            self._owner.release()
            self._owner = None


def _owners_dir(root: Path) -> Path:
    """Where the sessions' locks are: beside the output directory, which is bound into
    sandboxes, and not in it."""
    return root.parent / "owners"


@dataclass
class _OwnerLock:
    """A session's lock file in `owners/`, locked (`flock`) while the session's process
    lives."""

    path: Path
    fd: int

    @classmethod
    def take(cls, path: Path) -> _OwnerLock:
        """Create and lock `path`. A sweeping session may hold it for a moment (it found
        the file before we locked it): we wait, and make it again if it was removed.

        **Errors:** `TaskOutputError` when it cannot be made.
        """
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                raise TaskOutputError(f"cannot make {path}: {exc.strerror}") from None
            try:
                # Only warren processes of this user reach `owners/`, and a sweep holds a
                # lock for as long as one rmtree: blocking is safe.
                fcntl.flock(fd, fcntl.LOCK_EX)
                if _same_file(fd, path):
                    return cls(path, fd)
            except OSError as exc:
                os.close(fd)
                raise TaskOutputError(f"cannot lock {path}: {exc.strerror}") from None
            os.close(fd)  # a sweep removed it between our open and our lock

    def release(self) -> None:
        """Remove the file, then unlock it (closing it)."""
        with contextlib.suppress(OSError):
            self.path.unlink()
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _remove_unowned(root: Path, owners: Path) -> None:
    """Remove the output directory of every session whose lock nobody holds (its process
    is gone: SIGKILL, a crash), then its lock file. Quiet: what cannot be removed now is
    tried again by the next session."""
    try:
        names = os.listdir(owners)
    except OSError:
        return
    for name in names:
        session = name.removesuffix(".lock")
        if session == name or session in ("", ".", ".."):
            continue
        lock = owners / name
        try:
            fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # removed meanwhile, or not a file of ours
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # held: its session runs
            if not _same_file(fd, lock):
                continue  # removed and made again meanwhile
            shutil.rmtree(root / session, ignore_errors=True)
            with contextlib.suppress(OSError):
                lock.unlink()
        finally:
            os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    """Whether `path` still names the file open on `fd`."""
    try:
        opened, named = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino)


class OutputFile:
    """One task's output file, appended to as its bytes come, bounded."""

    def __init__(self, path: Path, fd: int, limit_bytes: int) -> None:
        self.path = path
        self._fd = fd
        self._limit = limit_bytes
        self._size = 0
        self.total = 0
        """Bytes written over the task's life, dropped ones included."""
        self.dropped = 0

    def write(self, data: bytes) -> None:
        """Append `data`; past the limit the file starts again from a line saying how much
        was dropped. A file that cannot be written is given up quietly (the task goes on;
        its notification still carries its last output)."""
        if self._fd < 0 or not data:
            return
        self.total += len(data)
        try:
            if self._size + len(data) > self._limit:
                self.dropped += self._size
                keep = data[-(self._limit // 2) :] if len(data) > self._limit // 2 else data
                self.dropped += len(data) - len(keep)
                os.ftruncate(self._fd, 0)
                os.lseek(self._fd, 0, os.SEEK_SET)
                note = (
                    f"[warren: {self.dropped} bytes of earlier output dropped "
                    f"([limits] task_output_bytes = {self._limit})]\n"
                ).encode()
                self._size = 0
                self._append(note)
                data = keep
            self._append(data)
        except OSError:
            self.close()

    def _append(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        self._size += len(data)

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


def _make_private(path: Path) -> None:
    """Make `path` and its parents from the `warren-<uid>` directory down, each a directory
    of ours, mode 0700, and check every one (a link is not a directory to `lstat`). Under
    `/tmp` (sticky) and below our own 0700 directory nobody else can swap a part later.

    **Errors:** `TaskOutputError`.
    """
    chain = [path]
    while not chain[-1].name.startswith("warren-"):
        if chain[-1].parent == chain[-1]:
            raise TaskOutputError(f"{path} is not below a warren-<uid> directory")
        chain.append(chain[-1].parent)
    for part in reversed(chain):
        try:
            os.mkdir(part, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise TaskOutputError(f"cannot make {part}: {exc.strerror}") from None
        _check(part)


def _check(part: Path) -> None:
    try:
        info = os.lstat(part)
    except OSError as exc:
        raise TaskOutputError(f"cannot use {part}: {exc.strerror}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise TaskOutputError(f"{part} is not a directory (a link?); remove it")
    if info.st_uid != os.getuid():
        raise TaskOutputError(f"{part} belongs to another user; remove it")
    if info.st_mode & 0o077:
        raise TaskOutputError(f"{part} is open to other users (mode {info.st_mode & 0o777:o})")
