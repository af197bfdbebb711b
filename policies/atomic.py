"""Reading and replacing small files in directories someone else may control.

The coordinator runs unsandboxed, so whatever it reads or writes in a repository is the
repository's choice of file unless it looks: a `.warren/policy.local.toml` that is a link to
`~/.bashrc`, a `.warren` directory that is a link elsewhere, a `CLAUDE.md` that is a FIFO (a
read that never returns) or a link to `/dev/zero` (a read that never ends). Policy files
(`policies.files`) and the trust store and its hash (`policies.trust`) go through here:

- `open_directory(path, beneath=root)` opens each component below `root` with `O_NOFOLLOW`,
  so the directory it returns is inside `root` whatever links the tree holds (`LinkRefused`).
- `read_regular` opens without following a link and without blocking, checks that it is a
  regular file and reads at most a bound: a FIFO, a device or a link is a state, never a
  read.
- `replace_file` is the one temp file + fsync + rename in Warren (the file tools' writes in
  `orchestrator/tools/_files.py` use it too): a reader sees the old bytes or the new ones,
  and a failure leaves the old bytes. The target's owner and mode are kept. Its temporary
  file is locked (`flock`) from its creation to its rename, so the sweep of what killed
  writes left (`sandbox.guard.remove_abandoned_temporary`) never takes a live one.
- `write_atomic` is `replace_file` below a trusted directory, plus a directory fsync; a
  target that is a link or not a regular file is refused (`LinkRefused`), any other failure
  is `AtomicWriteError`, "nothing changed".

Generic on purpose (nothing here knows policies), so the layers above can share it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "TEMPORARY_TRIES",
    "AtomicWriteError",
    "FileState",
    "LinkRefused",
    "RegularFile",
    "ReplaceFailed",
    "ReplaceStage",
    "open_directory",
    "read_regular",
    "replace_file",
    "temporary_name",
    "write_atomic",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_LINK_ERRNOS = (errno.ELOOP, errno.ENOTDIR, errno.EMLINK)


class LinkRefused(OSError):
    """A path that leads through a symbolic link (or a non-directory) where none may be."""


class AtomicWriteError(OSError):
    """The target was not replaced: its old bytes (or its absence) are as they were."""


def open_directory(
    path: Path, *, beneath: Path | None = None, create: bool = False, mode: int = 0o755
) -> int:
    """A file descriptor of the directory `path` (close it).

    With `beneath` (a directory the caller trusts; `path` must be lexically inside it), each
    component below it is opened with `O_NOFOLLOW`: a link there raises `LinkRefused`, so the
    result is inside `beneath`. Without it, `path` is opened as it resolves. `create` makes
    missing components with `mode`.

    **Errors:** `LinkRefused`; `FileNotFoundError` when missing and not `create`; `OSError`.
    """
    if beneath is None:
        if create:
            path.mkdir(parents=True, exist_ok=True, mode=mode)
        return os.open(path, _DIR_FLAGS)
    parts = path.relative_to(beneath).parts
    if ".." in parts:
        raise LinkRefused(errno.EINVAL, f"{path} is not inside {beneath}")
    fd = os.open(beneath, _DIR_FLAGS)
    try:
        walked = beneath
        for part in parts:
            walked = walked / part
            try:
                child = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, mode, dir_fd=fd)
                except FileExistsError:
                    pass  # made meanwhile: the open below checks what it is
                child = _open_child_dir(part, fd, walked)
            except OSError as exc:
                if exc.errno in _LINK_ERRNOS:
                    raise _refused(walked) from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_child_dir(part: str, fd: int, walked: Path) -> int:
    try:
        return os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
    except OSError as exc:
        if exc.errno in _LINK_ERRNOS:
            raise _refused(walked) from None
        raise


def _refused(path: Path) -> LinkRefused:
    return LinkRefused(
        errno.ELOOP,
        f"{path} is a symbolic link or not a directory; Warren does not follow links here",
    )


FileState = Literal["file", "missing", "link", "not a regular file", "too large"]


@dataclass(frozen=True)
class RegularFile:
    """What `read_regular` found at a path."""

    state: FileState
    content: bytes = b""
    """The bytes, for `file` only."""
    detail: str = ""
    """For `link`: the link's target text; for `too large` and `not a regular file`: size
    and modification time, so a change shows without reading the file."""


def read_regular(
    path: Path, *, limit: int, beneath: Path | None = None, follow_links: bool = False
) -> RegularFile:
    """Read `path` if it is a regular file of at most `limit` bytes.

    Opened with `O_NOFOLLOW | O_NONBLOCK` (a FIFO opens at once and is not read) and checked
    with `fstat`. `beneath` as in `open_directory` (a link in a parent is state `link`).
    `follow_links` (only for the user's own files, never a repository's) opens the final
    component through links; it is still checked to be a bounded regular file.

    **Errors:** `OSError` for anything but the states above (a permission error, I/O error).
    """
    try:
        dir_fd = open_directory(path.parent, beneath=beneath)
    except FileNotFoundError:
        return RegularFile("missing")
    except LinkRefused:
        return RegularFile("link", detail="(a parent directory)")
    try:
        try:
            fd = os.open(
                path.name,
                os.O_RDONLY
                | (0 if follow_links else os.O_NOFOLLOW)
                | os.O_NONBLOCK
                | os.O_CLOEXEC
                | os.O_NOCTTY,
                dir_fd=dir_fd,
            )
        except FileNotFoundError:
            return RegularFile("missing")
        except OSError as exc:
            if exc.errno not in _LINK_ERRNOS:
                raise
            try:
                return RegularFile("link", detail=os.readlink(path.name, dir_fd=dir_fd))
            except OSError:
                return RegularFile("link")
        try:
            info = os.fstat(fd)
            stamp = f"{info.st_size} {info.st_mtime_ns}"
            if not stat.S_ISREG(info.st_mode):
                return RegularFile("not a regular file", detail=f"{stat.S_IFMT(info.st_mode)}")
            if info.st_size > limit:
                return RegularFile("too large", detail=stamp)
            chunks: list[bytes] = []
            size = 0
            while size <= limit:
                chunk = os.read(fd, min(1 << 16, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            if size > limit:  # grew while read
                return RegularFile("too large", detail=stamp)
            return RegularFile("file", b"".join(chunks))
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)


def write_atomic(
    path: Path,
    data: bytes,
    *,
    beneath: Path | None = None,
    mode: int = 0o644,
    dir_mode: int = 0o755,
) -> None:
    """Replace `path` with `data` atomically (see the module docstring).

    `mode` is for a new file; an existing one keeps its own (and, for root, its owner).
    `beneath` as in `open_directory`; missing directories are made with `dir_mode`.

    **Errors:** `LinkRefused` (a link on the way or as the target; nothing written),
    `AtomicWriteError` (nothing changed), `OSError` when only the final directory sync
    failed (the file was replaced).
    """
    if beneath is not None:  # a workspace file: running sandboxes' guards must not undo it
        from sandbox.guard import coordinator_writes

        coordinator_writes(path)
    try:
        dir_fd = open_directory(path.parent, beneath=beneath, create=True, mode=dir_mode)
    except LinkRefused:
        raise
    except OSError as exc:
        raise AtomicWriteError(
            exc.errno or errno.EIO, f"cannot write {path}: {exc.strerror or exc}; nothing changed"
        ) from exc
    try:
        _replace(path, data, dir_fd, mode)
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _replace(path: Path, data: bytes, dir_fd: int, mode: int) -> None:
    name = path.name
    try:
        old: os.stat_result | None = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        old = None
    if old is not None and not stat.S_ISREG(old.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(old.st_mode) else "not a regular file"
        raise LinkRefused(
            errno.ELOOP, f"{path} is {kind}; Warren does not write through it (nothing changed)"
        )
    try:
        replace_file(name, data, old=old, mode=mode, dir_fd=dir_fd)
    except ReplaceFailed as exc:
        raise AtomicWriteError(
            exc.errno or errno.EIO,
            f"cannot write {path}: {exc.strerror or exc} ({exc.stage}); nothing changed",
        ) from exc


_TEMP_NAME_BYTES = 200
"""Longest target name kept whole in a temporary file's name (names are at most 255 bytes)."""
TEMPORARY_TRIES = 3
"""Temporary files `replace_file` makes before it gives up when a sweep takes each one
between its creation and its lock (a sweep of a sandbox starting just then)."""

ReplaceStage = Literal["temporary file", "owner", "content", "rename"]


class ReplaceFailed(OSError):
    """`replace_file` did not replace the target: it is as it was, the temporary file gone.
    `stage` says what failed."""

    def __init__(self, stage: ReplaceStage, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.stage: ReplaceStage = stage


def temporary_name(name: str) -> str:
    """`.<name>.warren-<12 hex>.tmp`: the name `sandbox.guard.STALE_TEMPORARY` knows, so what a
    write killed before its rename left behind is swept at the next start (a live write's
    is locked, and stays: `_claim_temporary`)."""
    if len(os.fsencode(name)) > _TEMP_NAME_BYTES:
        name = name[:40]
    return f".{name}.warren-{secrets.token_hex(6)}.tmp"


def replace_file(
    path: Path | str,
    data: bytes,
    *,
    old: os.stat_result | None,
    mode: int = 0o666,
    dir_fd: int | None = None,
    durable: bool = True,
) -> None:
    """Replace the regular file `path` (relative to `dir_fd` when given) with `data`, all or
    nothing: the one place Warren does temp file + fsync + rename.

    The bytes go to `temporary_name` beside the target (O_EXCL, no link followed, locked until
    renamed: `_claim_temporary`), which gets `old`'s owner and permission bits (owner first: a
    chown clears set-user-ID bits the chmod then restores) or, for a new file, `mode` less the
    umask; it is fsynced and renamed over the target. A crash at any moment leaves the old
    bytes or all the new ones. A file whose owner cannot be kept (someone else's, writable
    through group bits) is not replaced: renaming our copy over it would quietly make it ours.
    The directory is not fsynced here.
    Not `durable`: no fsync (milliseconds to tens of them), for a file that is a cache of
    another: after a crash it may hold the old bytes, the new ones or none, never a mix of
    the two, as far as the file system's rename ordering goes.

    **Errors:** `ReplaceFailed` (nothing changed; the temporary file is removed).
    """
    folder, name = os.path.split(os.fspath(path))
    fd, temp = _claim_temporary(folder, name, 0o600 if old is not None else mode, dir_fd)
    stage: ReplaceStage = "temporary file"
    lock = -1
    renamed = False
    try:
        try:
            # The same open file under a second descriptor: its lock outlives `fd`, whose
            # close (where some file systems report a failed write) comes before the rename.
            lock = os.dup(fd)
            stage = "owner"
            if old is not None:
                now = os.fstat(fd)
                if (now.st_uid, now.st_gid) != (old.st_uid, old.st_gid):
                    os.fchown(fd, old.st_uid, old.st_gid)
                os.fchmod(fd, stat.S_IMODE(old.st_mode))
            stage = "content"
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        stage = "rename"
        os.rename(temp, name if dir_fd is not None else path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        renamed = True
    except OSError as exc:
        raise ReplaceFailed(stage, exc) from exc
    finally:
        if not renamed:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
        if lock >= 0:
            os.close(lock)


def _claim_temporary(folder: str, name: str, mode: int, dir_fd: int | None) -> tuple[int, str]:
    """A new temporary file for `name` in `folder`, open for writing and locked (an exclusive
    `flock`), with its path.

    Why the lock: every writable sandbox's guard, as it starts, removes the temporary files of
    writes killed before their rename (`sandbox.guard`), while other writers in the same
    workspace may be between their creation and their rename (a pool's replacement warm
    writer starting beside running scoped writers, another session). The sweep removes only
    a temporary it could lock itself (`sandbox.guard.remove_abandoned_temporary`). It may get
    between the creation and the lock: then the lock is refused (the sweep holds it) or the
    file has no name left, and another name is tried. On a file system without locks
    neither side can lock: nothing is swept there.
    tests/policies/test_atomic.py runs the sweep at both moments.

    **Errors:** `ReplaceFailed` at stage "temporary file".
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    for _ in range(TEMPORARY_TRIES):
        temp = os.path.join(folder, temporary_name(name))
        try:
            fd = os.open(temp, flags, mode, dir_fd=dir_fd)  # private until its mode is set
        except OSError as exc:
            raise ReplaceFailed("temporary file", exc) from exc
        try:
            claimed = _lock_new(fd)
        except OSError as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            raise ReplaceFailed("temporary file", exc) from exc
        if claimed:
            return fd, temp
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
    raise ReplaceFailed(
        "temporary file",
        OSError(errno.EBUSY, f"each of {TEMPORARY_TRIES} temporary files was removed at once"),
    )


def _lock_new(fd: int) -> bool:
    """Lock the temporary file just made as `fd`; False when a sweep got to it first (it holds
    the lock, or has removed the name already)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            return True  # no locks on this file system: no sweep can lock it either
        raise
    return os.fstat(fd).st_nlink > 0
