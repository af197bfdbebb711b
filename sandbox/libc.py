"""The C library this process already has loaded, for the calls Python does not wrap (inotify).

`ctypes.CDLL(None)` is `dlopen(NULL)`: no search, no process. Not `ctypes.util.find_library`,
which forks and execs `ldconfig -p` (or a compiler) on every call: a process start on the launch
path of every session, and one per watched directory where it was called per watch.
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct
from collections.abc import Iterator

__all__ = ["IN_IGNORED", "IN_Q_OVERFLOW", "inotify_events", "libc"]

IN_Q_OVERFLOW = 0x4000
"""The kernel's queue overflowed: events were lost."""
IN_IGNORED = 0x8000
"""The watch `wd` is gone (its directory was removed)."""
_EVENT = struct.Struct("iIII")


@functools.cache
def libc() -> ctypes.CDLL:
    """The loaded C library, `errno` kept for `ctypes.get_errno()`."""
    return ctypes.CDLL(None, use_errno=True)


def inotify_events(fd: int) -> Iterator[tuple[int, int, bytes]]:
    """The events queued on the non-blocking inotify descriptor `fd`, as (watch descriptor,
    mask, name: empty for the watched directory itself), until the queue is empty.

    **Errors:** `OSError` from `read` (not the empty queue's `BlockingIOError`).
    """
    while True:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        offset = 0
        while offset < len(data):
            wd, mask, _cookie, size = _EVENT.unpack_from(data, offset)
            name = data[offset + 16 : offset + 16 + size].rstrip(b"\0")
            offset += 16 + size
            yield wd, mask, name
