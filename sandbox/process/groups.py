"""Stopping a process group or a whole session whose members are not our children: SIGTERM,
a grace during which we poll /proc until they are gone, then SIGKILL.

The persistent Bash shell (orchestrator/tools/shell.py) runs each command as a job that leads
its own process group inside the shell's session: a timeout stops the command's group
(`terminate_group`) and leaves the shell alive; a shell that stopped answering is stopped
with its whole session (`stop_session`). A hook that runs as a plain process group has what
it left in its group killed at its end (`kill_group`). Nothing here can wait for an exit
(these are bash's children, not ours), so the grace is polled (`sandbox.process.tree.
until_gone`).
"""

from __future__ import annotations

import os
import signal

from sandbox.process.tree import alive, signal_each, until_gone

__all__ = ["kill_group", "members", "stop_session", "terminate_group"]


def members(*, pgid: int | None = None, sid: int | None = None) -> list[int]:
    """The live processes (zombies excluded) of process group `pgid` and/or session `sid`."""
    if pgid is not None:
        try:
            os.killpg(pgid, 0)  # no such group: skip the scan of every process
        except OSError:
            return []
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            if pgid is not None and os.getpgid(pid) != pgid:
                continue
            if sid is not None and os.getsid(pid) != sid:
                continue
        except OSError:
            continue
        found.append(pid)
    return alive(found)


def kill_group(pgid: int) -> None:
    """SIGKILL process group `pgid`, whatever is left of it (nothing: no error)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def terminate_group(pgid: int, grace_s: float) -> None:
    """SIGTERM (and SIGCONT) process group `pgid`, allow `grace_s` seconds for every member
    to go, then SIGKILL what is left.

    **Cancellation:** call it shielded; it is bounded by `grace_s`.
    **Errors:** none (a group that is gone already is no error)."""
    try:
        os.killpg(pgid, signal.SIGTERM)
        os.killpg(pgid, signal.SIGCONT)  # a stopped process acts on SIGTERM only once resumed
    except OSError:
        return  # no such group: nothing left to stop
    if not await until_gone(lambda: members(pgid=pgid), grace_s):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass


async def stop_session(sid: int, grace_s: float) -> None:
    """SIGTERM every live process of session `sid`, allow `grace_s`, then SIGKILL those left.
    The session's leader must not be reaped before this ends, or its id could be reused.

    **Cancellation:** call it shielded; it is bounded by `grace_s`.
    **Errors:** none (what is gone already is no error)."""
    signal_each(members(sid=sid), signal.SIGTERM)
    if not await until_gone(lambda: members(sid=sid), grace_s):
        signal_each(members(sid=sid), signal.SIGKILL)
