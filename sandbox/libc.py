"""The C library this process already has loaded, for the calls Python does not wrap (inotify).

`ctypes.CDLL(None)` is `dlopen(NULL)`: no search, no process. Not `ctypes.util.find_library`,
which forks and execs `ldconfig -p` (or a compiler) on every call: a process start on the launch
path of every session, and one per watched directory where it was called per watch.
"""

from __future__ import annotations

import ctypes
import functools

__all__ = ["libc"]


@functools.cache
def libc() -> ctypes.CDLL:
    """The loaded C library, `errno` kept for `ctypes.get_errno()`."""
    return ctypes.CDLL(None, use_errno=True)
