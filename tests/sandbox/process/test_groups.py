"""Process groups and sessions that are not our children (`sandbox.process.groups`): polled
until gone, a member that ignores SIGTERM killed after the grace."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from sandbox.process.groups import kill_group, members, stop_session, terminate_group
from tests.sandbox.process.kit import IGNORES_TERM, first_line, gone, start, with_grandchild


async def test_terminate_group_kills_a_member_that_ignores_sigterm_after_the_grace() -> None:
    leader, pid = await start(with_grandchild(IGNORES_TERM))
    grandchild = int(pid)
    assert await first_line(leader) == "ready"
    assert set(members(pgid=leader.pid)) == {leader.pid, grandchild}
    began = time.monotonic()
    await terminate_group(leader.pid, 0.5)
    assert time.monotonic() - began >= 0.5  # the grandchild had its grace
    assert await gone([grandchild])
    await leader.wait()
    assert leader.returncode == -signal.SIGTERM
    assert members(pgid=leader.pid) == []


async def test_stop_session_reaches_a_member_of_another_group() -> None:
    # `setsid` would leave the session; a new process group in the same session does not.
    leader, pid = await start(
        ["bash", "-c", f"set -m; {with_grandchild(IGNORES_TERM)[2]} & wait", "bash"]
    )
    del pid
    sid = leader.pid
    found = members(sid=sid)
    assert len({os.getpgid(p) for p in found}) >= 2
    await stop_session(sid, 0.3)
    assert await gone(found)
    await leader.wait()


def test_kill_group_is_no_error_for_a_group_that_is_gone() -> None:
    process = subprocess.Popen(["true"], start_new_session=True)
    process.wait()
    kill_group(process.pid)
    assert members(pgid=process.pid) == []
