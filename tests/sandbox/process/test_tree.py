"""Process trees from /proc (`sandbox.process.tree`): the walk finds every descendant, even
one that left its session, and `kill_tree` leaves none of them, even one that ignores SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess

import trio

from sandbox.process.subreaper import become_subreaper
from sandbox.process.tree import (
    alive,
    children,
    descendants,
    family,
    kill_tree,
    our_children,
    session_of,
)
from tests.sandbox.process.kit import first_line, gone

ESCAPES = (
    "(setsid sleep 1000 &); (sleep 1000 &); nohup sleep 1000 >/dev/null 2>&1 &"
    " (trap '' TERM; exec sleep 1000) & echo started; wait"
)
"""A setsid'd, a double-forked, a nohup'd and a SIGTERM-ignoring sleep, below bash."""


async def _subreaper_running_escapes() -> trio.Process:
    """bash, a child subreaper, that started `ESCAPES`: none can leave its subtree."""
    process = await trio.lowlevel.open_process(
        ["bash", "-c", ESCAPES],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=become_subreaper,
    )
    assert await first_line(process) == "started"
    with trio.fail_after(10):
        # The forks are in flight, and nothing tells us of a grandchild's: look again.
        while len([p for p in descendants(process.pid) if _name(p) == "sleep"]) < 4:  # noqa: ASYNC110
            await trio.sleep(0.01)
    return process


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return ""


async def test_the_walk_finds_what_left_its_session_and_its_parent() -> None:
    process = await _subreaper_running_escapes()
    try:
        found = descendants(process.pid)
        assert family(process.pid) == [process.pid, *found]
        assert process.pid not in found
        sessions = {session_of(pid) for pid in found}
        assert len(sessions) == 2  # bash's own, and the setsid'd sleep's
        assert set(children(process.pid)) <= set(found)
        assert process.pid in our_children()
    finally:
        await kill_tree(process.pid, 0.0)
        process.kill()
        await process.wait()


async def test_kill_tree_leaves_no_descendant_and_spares_the_root() -> None:
    process = await _subreaper_running_escapes()
    found = descendants(process.pid)
    try:
        await kill_tree(process.pid, 0.3)
        assert await gone(found)
        assert alive(descendants(process.pid)) == []
    finally:
        with trio.fail_after(10):
            code = await process.wait()  # its `wait` ends with its jobs
    assert code >= 0  # not signalled itself


def test_alive_counts_a_zombie_as_gone() -> None:
    process = subprocess.Popen(["true"], start_new_session=True)
    try:
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
        assert alive([process.pid]) == []
        assert session_of(process.pid) == process.pid  # a zombie still has its stat
    finally:
        process.wait()
    assert session_of(process.pid) is None


async def test_a_stopped_descendant_still_goes_on_sigterm() -> None:
    """`kill_tree` sends SIGCONT after SIGTERM: a stopped process acts on it only once resumed."""
    process = await trio.lowlevel.open_process(
        ["bash", "-c", "sleep 1000 & echo $!; wait"],
        stdout=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=become_subreaper,
    )
    sleeper = int(await first_line(process))
    os.kill(sleeper, signal.SIGSTOP)
    try:
        await kill_tree(process.pid, 10.0)
        assert await gone([sleeper])
    finally:
        process.kill()
        await process.wait()
