"""Child subreapers (`sandbox.process.subreaper`): what a command leaves running, even what
left its session, is handed to the subreaper parent and killed when the command ends; the
parent exits with the command's status. Each way of making one is checked, and the same
command without a subreaper, which leaves its orphan running (so these tests can fail)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox.process.subreaper import (
    become_subreaper,
    kills_leftovers,
    perl_reaper,
    subreaper_shim,
)
from sandbox.process.tree import alive
from tests.sandbox.process.kit import gone

LEAVES = "setsid sleep 1000 >/dev/null 2>&1 & echo $! > {pidfile}; exit 3"
"""A command that leaves a sleep in a session of its own and exits 3."""


def _run(argv: list[str], preexec: Callable[[], None] | None = None) -> int:
    done = subprocess.run(argv, preexec_fn=preexec, timeout=30, start_new_session=True)
    return done.returncode


def _orphan(pidfile: Path) -> int:
    return int(pidfile.read_text())


async def test_the_perl_reaper_kills_what_the_command_left(tmp_path: Path) -> None:
    prefix = perl_reaper()
    if not prefix:
        pytest.skip("no perl (or an unknown architecture)")
    pidfile = tmp_path / "pid"
    assert _run([*prefix, LEAVES.format(pidfile=pidfile)]) == 3
    assert await gone([_orphan(pidfile)])


async def test_bash_made_a_subreaper_between_fork_and_exec_does_the_same(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    script = kills_leftovers('/bin/sh -c "$1"')
    argv = ["bash", "--noprofile", "--norc", "-c", script, "t", LEAVES.format(pidfile=pidfile)]
    assert _run(argv, become_subreaper) == 3
    assert await gone([_orphan(pidfile)])


async def test_the_shim_makes_bash_a_subreaper(tmp_path: Path) -> None:
    shim = subreaper_shim()
    if not shim:
        pytest.skip("no perl (or an unknown architecture)")
    pidfile = tmp_path / "pid"
    script = kills_leftovers('/bin/sh -c "$1"')
    argv = [*shim, "bash", "--noprofile", "--norc", "-c", script, "t"]
    assert _run([*argv, LEAVES.format(pidfile=pidfile)]) == 3
    assert await gone([_orphan(pidfile)])


async def test_without_a_subreaper_the_orphan_escapes(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    script = kills_leftovers('/bin/sh -c "$1"')
    argv = ["bash", "--noprofile", "--norc", "-c", script, "t", LEAVES.format(pidfile=pidfile)]
    assert _run(argv) == 3
    orphan = _orphan(pidfile)
    try:
        assert not await gone_soon(orphan)
    finally:
        os.kill(orphan, signal.SIGKILL)


async def gone_soon(pid: int) -> bool:
    """Whether `pid` is gone now (the subreaper cases kill before they exit)."""
    return alive([pid]) == []
