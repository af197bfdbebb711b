"""Reading a file the sandbox (or a repository) controls, from outside it, without being fooled.

A name in a workspace can be a symlink to a secret (`CLAUDE.md -> ~/.ssh/id_rsa`), a FIFO
that blocks the reader forever, or a link to `/dev/zero` that never ends. Whoever reads such a
name on the host (context gathering, policy and trust files, agent definitions) opens it with
`read_bounded_regular`: no link followed at the last component, no blocking open, regular
files only, at most `limit` bytes read.

Stdlib only and free of Warren imports: the context probe loads this file by path inside a
sandbox (`python -I -S`) without importing the `sandbox` package.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = [
    "NotARegularFile",
    "read_at_most",
    "read_bounded_regular",
    "read_unchanged_at",
    "same_file",
]


class NotARegularFile(OSError):
    """The name is a symlink, FIFO, device, socket or directory: refused, nothing was read."""


def read_bounded_regular(path: str | os.PathLike[str], limit: int) -> tuple[bytes, bool]:
    """The first `limit` bytes of the regular file at `path` and whether there was more.

    The last component is never followed (`O_NOFOLLOW`), the open never blocks (`O_NONBLOCK`:
    a FIFO opens at once and is then refused), and anything but a regular file is refused
    after `fstat` on the open descriptor (no race between the check and the read).

    **Errors:** `NotARegularFile` for a symlink or a non-regular file; other `OSError`s
    (missing, unreadable) as raised by `open`/`read`.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotARegularFile(exc.errno, "is a symbolic link", str(path)) from exc
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotARegularFile(0, "is not a regular file", str(path))
        data = read_at_most(fd, limit + 1)
    finally:
        os.close(fd)
    return data[:limit], len(data) > limit


def read_at_most(fd: int, limit: int) -> bytes:
    """Up to `limit` bytes from the open `fd`, fewer only at its end (a short read is not
    the end)."""
    chunks: list[bytes] = []
    want = limit
    while want > 0:
        chunk = os.read(fd, min(want, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        want -= len(chunk)
    return b"".join(chunks)


def same_file(a: os.stat_result, b: os.stat_result) -> bool:
    """Whether two stats describe the same file with the same content as far as the file
    system can tell: device, inode, size, mtime and ctime (a write changes the ctime, which
    no one can set back)."""
    return (a.st_dev, a.st_ino, a.st_size, a.st_mtime_ns, a.st_ctime_ns) == (
        b.st_dev,
        b.st_ino,
        b.st_size,
        b.st_mtime_ns,
        b.st_ctime_ns,
    )


def read_unchanged_at(dir_fd: int, name: str, info: os.stat_result, limit: int) -> bytes | None:
    """The content of the regular file `name` in the directory open as `dir_fd`, which an
    `lstat` found as `info`; None when it is no longer that file unchanged (swapped for a
    link, FIFO or another file, or written while read) or holds more than `limit` bytes.

    Opened like `read_bounded_regular` (`O_NOFOLLOW | O_NONBLOCK`, checked on the open
    descriptor), relative to `dir_fd` so no directory on the way is looked up by name again.

    **Errors:** `OSError` from `open`/`read` (missing, unreadable).
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    fd = os.open(name, flags, dir_fd=dir_fd)
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode) or not same_file(before, info):
            return None
        data = read_at_most(fd, limit + 1)
        if len(data) > limit or not same_file(os.fstat(fd), info):
            return None
    finally:
        os.close(fd)
    return data
