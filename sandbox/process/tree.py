"""Process trees read from /proc: a process's children and descendants, whether they are still
alive, and killing a whole subtree (`kill_tree`).

Read raw from each thread's `/proc/PID/task/TID/children` file (an orphan handed to a
subreaper goes to any of its threads), not through psutil: a walk of the tree only, where
psutil's `children()` reads the parent of every process on the machine (a tenth of the
coordinator's CPU in a 10-worker run, tests/bench/bench_pool.py). The pool measures every
worker's tree twice a second and the sandbox watchdog reads bwrap's children ten times a
second, both in the coordinator's trio thread (`sandbox.limits`).

Used by the one-shot Bash runs and hooks (a subreaper's subtree killed at a timeout), the
adoption of orphans (`sandbox.process.orphans`), the reaping of sandbox inits
(`sandbox.process.reaper`) and the sandbox's limits (a tree's memory and CPU, bwrap's init).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterable

import trio

__all__ = [
    "alive",
    "children",
    "descendants",
    "family",
    "kill_tree",
    "our_children",
    "session_of",
    "signal_each",
    "until_gone",
]

POLL_S = 0.02
"""How often `until_gone` looks again: what it waits for are not our children, so nothing
tells us when they exit."""

_KILL_AGAIN_S = 0.005
"""Pause between two rounds of `kill_tree`'s SIGKILLs (what was killed needs a moment to go;
what keeps forking is killed again)."""


def children(pid: int) -> list[int]:
    """The children of `pid`'s main thread (one raw read: enough for a single-threaded
    launcher such as bwrap, whose first child is its sandbox's init)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as listing:
            return [int(child) for child in listing.read().split()]
    except (OSError, ValueError):
        return []


def _children_of_every_thread(pid: int | str) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        with (
            contextlib.suppress(OSError, ValueError),
            open(f"/proc/{pid}/task/{task}/children", "rb") as listing,
        ):
            found += map(int, listing.read().split())
    return found


def our_children() -> list[int]:
    """This process's children, from each of its threads (an orphan goes to any thread)."""
    return _children_of_every_thread("self")


def family(pid: int) -> list[int]:
    """`pid` and all its descendants, parents before children."""
    found = [pid]
    for member in found:  # grows as we go
        found += _children_of_every_thread(member)
    return found


def descendants(pid: int) -> list[int]:
    """The descendants of `pid` (not `pid`)."""
    return family(pid)[1:]


def session_of(pid: int) -> int | None:
    """The session id of `pid` (a zombie's too), from `/proc/<pid>/stat`; None when gone."""
    fields = _stat_fields(pid)
    return int(fields[3]) if fields is not None and len(fields) > 3 else None


def alive(pids: Iterable[int]) -> list[int]:
    """Those of `pids` that still run (neither gone nor zombies)."""
    found = []
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None and fields[:1] != ["Z"]:
            found.append(pid)
    return found


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of `/proc/<pid>/stat` after the command name (which may hold anything):
    the state first."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            data = stat.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].decode(errors="replace").split()


def signal_each(pids: Iterable[int], sig: signal.Signals) -> None:
    """Send `sig` to each of `pids` that still exists. A SIGTERM is followed by SIGCONT: a
    stopped process acts on SIGTERM only once resumed."""
    for pid in pids:
        try:
            os.kill(pid, sig)
            if sig == signal.SIGTERM:
                os.kill(pid, signal.SIGCONT)
        except OSError:
            pass


async def until_gone(live: Callable[[], list[int]], limit_s: float) -> bool:
    """Poll `live()` every `POLL_S` until it is empty (True) or `limit_s` passes (False).

    **Cancellation:** returns at once (unless shielded by the caller).
    **Errors:** whatever `live` raises."""
    with trio.move_on_after(limit_s):
        while True:
            if not live():
                return True
            await trio.sleep(POLL_S)
    return False


async def kill_tree(pid: int, grace_s: float) -> None:
    """SIGTERM every descendant of `pid`, allow `grace_s` for them to go, then SIGKILL until
    none is left, for at most `max(grace_s, 1)` more seconds. `pid` itself is not signalled:
    it is a child subreaper (the parent a one-shot or a hook runs below), so nothing its
    command starts can leave its subtree, not even by `setsid` or a double fork.

    **Cancellation:** call it shielded; it is bounded by about twice `grace_s` (at least 1 s).
    **Errors:** none (what is gone already is no error).
    """
    signal_each(descendants(pid), signal.SIGTERM)
    if await until_gone(lambda: alive(descendants(pid)), grace_s):
        return
    with trio.move_on_after(max(grace_s, 1.0)):
        while live := alive(descendants(pid)):
            signal_each(live, signal.SIGKILL)
            await trio.sleep(_KILL_AGAIN_S)
