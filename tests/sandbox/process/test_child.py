"""Stopping a child we started (`sandbox.process.child`): end of input, SIGTERM, the grace,
SIGKILL, each step only as long as the child is still there; a child's whole process group
with `group`; `open_child` around a block."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import trio

from sandbox.process.child import open_child, stop_child
from sandbox.process.tree import alive
from tests.sandbox.process.kit import (
    IGNORES_TERM,
    LEAVES_AT_EOF,
    LEAVES_ON_TERM,
    first_line,
    gone,
    python,
    start,
    with_grandchild,
)


async def test_a_child_that_ignores_sigterm_gets_sigkill_after_the_grace() -> None:
    child, _ = await start(python(IGNORES_TERM))
    began = time.monotonic()
    await stop_child(child, grace_s=0.5, kill_wait_s=5.0)
    took = time.monotonic() - began
    assert child.returncode == -signal.SIGKILL
    assert took >= 0.5  # it had its whole grace: nothing else could have ended it sooner
    assert took < 5.0


async def test_a_child_that_leaves_on_sigterm_is_never_killed() -> None:
    child, _ = await start(python(LEAVES_ON_TERM))
    await stop_child(child, grace_s=30.0)
    assert child.returncode == -signal.SIGTERM


async def test_a_child_that_leaves_at_the_end_of_its_input_gets_no_signal() -> None:
    child, _ = await start(python(LEAVES_AT_EOF))
    await stop_child(child, eof_grace_s=30.0, grace_s=30.0)
    assert child.returncode == 0


async def test_no_grace_means_sigkill_at_once(tmp_path: Path) -> None:
    marker = tmp_path / "terminated"
    code = (
        "import pathlib, signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *_: (pathlib.Path({str(marker)!r}).touch(), "
        "sys.exit(0)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    child, _ = await start(python(code))
    await stop_child(child, grace_s=None)
    assert child.returncode == -signal.SIGKILL
    assert not marker.exists()


async def test_the_group_takes_what_the_child_started_with_it() -> None:
    # The grandchild ignores SIGTERM: bash dies of it, and only the group's SIGKILL, sent
    # although bash is gone by then, ends the grandchild.
    child, pid = await start(with_grandchild(IGNORES_TERM))
    grandchild = int(pid)
    assert await first_line(child) == "ready"
    await stop_child(child, grace_s=5.0, group=True)
    assert child.returncode == -signal.SIGTERM
    assert await gone([grandchild])


async def test_without_the_group_the_grandchild_lives_on() -> None:
    """The test above can fail: signalled alone, bash leaves its job running."""
    child, pid = await start(with_grandchild(IGNORES_TERM))
    grandchild = int(pid)
    assert await first_line(child) == "ready"
    try:
        await stop_child(child, grace_s=0.5)
        assert child.returncode is not None
        assert alive([grandchild]) == [grandchild]
    finally:
        os.kill(grandchild, signal.SIGKILL)


async def test_stop_runs_to_its_end_under_cancellation() -> None:
    child, _ = await start(python(IGNORES_TERM))
    with trio.CancelScope() as scope:
        scope.cancel()
        await stop_child(child, grace_s=0.2, kill_wait_s=5.0)
    assert child.returncode == -signal.SIGKILL


async def test_open_child_stops_it_and_its_group_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError, match="the caller failed"):
        argv = with_grandchild(IGNORES_TERM)
        async with open_child(argv, env={}, cwd=None, grace_s=0.2) as child:
            grandchild = int(await first_line(child))
            assert await first_line(child) == "ready"
            raise RuntimeError("the caller failed")
    assert child.returncode is not None
    assert await gone([grandchild])
