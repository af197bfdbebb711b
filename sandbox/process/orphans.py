"""Adopting what one-shot commands leave behind: the process that runs them is the child
subreaper of them all, and kills their orphans when each call ends.

`PersistentShell.run_oneshot` must leave nothing running, not even what left the command's
process group (`setsid`, a double fork, `nohup`). Without adoption each one-shot runs under its
own subreaper bash, started through a perl shim (`sandbox.process.subreaper`), which costs two extra
execs (~3 ms) a call. A process where *only* one-shots run (the read-only tool host, a read-only
agent worker) calls `adopt_orphans()` once instead: it becomes a child subreaper itself (an
in-process prctl, no fork), so every orphan of every one-shot becomes its child, and
`Adoption.sweep` kills and reaps them when a call ends:

* an orphan still in the ended call's session (a double fork, `nohup`, a background job) at
  once;
* one that left its session (`setsid`) cannot be told apart from a concurrent call's: it is
  killed when no one-shot is running or starting, i.e. at the end of the last of a concurrent
  batch. A later call never sees it.

Never call `adopt_orphans` in a process where anything else may leave processes behind on
purpose (a persistent shell's background server): the sweep would kill them.

Why not a pid namespace per one-shot (the kernel would kill everything in it when its first
process exits): inside the sandbox no process can make one. `unshare(CLONE_NEWPID)` needs
CAP_SYS_ADMIN, which `--cap-drop ALL` took (EPERM), and the nested user namespace that would
give it is refused by `--disable-userns` (ENOSPC); that refusal is a floor property
(tests/sandbox/test_escape.py, `new_user_namespace`). Measured without
`--disable-userns`, a fork + `unshare(CLONE_NEWUSER | CLONE_NEWPID)` + fork per one-shot
does kill a `setsid`, `nohup` and double-forked child with it, but cost 1.7 times a plain
fork + exec (+20 ms and +44 ms a call at load averages of 10 and 18 on the 2-core dev box;
no unloaded figure yet), besides reopening nested user namespaces to every tool process.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import trio

from sandbox.process.subreaper import become_subreaper
from sandbox.process.tree import our_children, session_of

__all__ = ["Adoption", "adopt_orphans", "adoption"]

SWEEP_LIMIT_S = 2.0
"""Longest a sweep keeps killing what keeps appearing (a fork bomb) before it gives up."""


class Adoption:
    """This process's bookkeeping as the subreaper of its one-shots."""

    def __init__(self) -> None:
        self._sid = os.getsid(0)
        self._running: set[int] = set()
        """Pids (also session ids) of the one-shot bashes and persistent shells we started."""
        self._starting = 0

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """Around starting a session leader: while it forks, a sweep kills only what it can
        attribute (the new process is our child before it is registered)."""
        self._starting += 1
        try:
            yield
        finally:
            self._starting -= 1

    def started(self, pid: int) -> None:
        """`pid` (a new session's leader, started by us) is running: never an orphan."""
        self._running.add(pid)

    def ended(self, pid: int) -> None:
        self._running.discard(pid)

    async def sweep(self, sid: int) -> list[int]:
        """Kill and reap the orphans of the ended one-shot whose session was `sid`; when no
        one-shot runs or starts, every orphan. Bounded by `SWEEP_LIMIT_S`; returns the pids
        reaped. Shield it when it must finish under cancellation."""
        reaped: list[int] = []
        with trio.move_on_after(SWEEP_LIMIT_S):
            while True:
                everything = not self._running and not self._starting
                orphans = [pid for pid, of in self._orphans() if everything or of == sid]
                if not orphans:
                    break
                for pid in orphans:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                for pid in orphans:
                    with contextlib.suppress(ChildProcessError):
                        if os.waitpid(pid, os.WNOHANG)[0] == pid:  # noqa: ASYNC222 (WNOHANG)
                            reaped.append(pid)
                if not set(orphans) <= set(reaped):
                    await trio.sleep(0.001)  # killed, not yet dead: let the kernel finish
        return reaped

    def _orphans(self) -> list[tuple[int, int]]:
        """(pid, session id) of our children that we did not start: adopted orphans. What we
        start without a new session (rg, `bash -n`) shares our session, which no orphan of a
        one-shot can join; what we start with one is registered through `started`."""
        found = []
        for pid in our_children():
            if pid in self._running:
                continue
            sid = session_of(pid)
            if sid is not None and sid != self._sid:
                found.append((pid, sid))
        return found


_ADOPTION: Adoption | None = None


def adopt_orphans() -> Adoption:
    """Make this process the child subreaper of everything it starts (once; see the module
    docstring for where that is allowed). Raises `OSError` when the kernel refuses."""
    global _ADOPTION
    if _ADOPTION is None:
        become_subreaper()
        _ADOPTION = Adoption()
    return _ADOPTION


def adoption() -> Adoption | None:
    """This process's adoption, when `adopt_orphans` was called."""
    return _ADOPTION
