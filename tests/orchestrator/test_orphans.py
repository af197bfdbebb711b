"""A process that adopts its one-shots' orphans (`sandbox.process.orphans`, as the read-only tool
host and agent worker do) leaves nothing of a call running, and no zombie, checked on the host.

Adoption makes the whole process a child subreaper, so each case runs in a child Python
process of its own (`CHILD` below) that reports what it saw as JSON; the escapees are found by
a unique `sleep` argument anywhere on the host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.orchestrator.test_shell import ESCAPES, marker_sleep

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys, trio, psutil
from pathlib import Path
from sandbox.process.orphans import adopt_orphans
from orchestrator.tools.shell import PersistentShell, shell_environment

adopt_orphans()
case = json.loads(sys.stdin.read())  # not argv: our own command line would hold the markers

def live(marker):
    return [p.pid for p in psutil.process_iter(["cmdline", "status"])
            if p.info["status"] != psutil.STATUS_ZOMBIE
            and marker in " ".join(p.info["cmdline"] or [])]

def zombies():
    return [c.pid for c in psutil.Process().children()
            if c.status() == psutil.STATUS_ZOMBIE]

async def main():
    shell = PersistentShell(cwd=Path(case["cwd"]), env=shell_environment(), output_limit=10000)
    seen = {}
    try:
        if case["kind"] == "end":
            started, end = case["started"], case["end"]
            if end == "returns":
                run = await shell.run_oneshot(started + "\necho started", timeout_s=10)
                seen["stdout"] = run.stdout
            elif end == "times out":
                run = await shell.run_oneshot(started + "\nsleep 30", timeout_s=0.5)
                seen["timed_out"] = run.timed_out
            else:
                with trio.move_on_after(0.5) as scope:
                    await shell.run_oneshot(started + "\nsleep 30", timeout_s=10)
                seen["cancelled"] = scope.cancelled_caught
            seen["left"] = live(case["marker"])
        else:  # one call ends while another still runs
            async def long():
                run = await shell.run_oneshot(case["long"], timeout_s=10)
                seen["long_stdout"] = run.stdout
            release = Path(case["cwd"]) / "release"
            async with trio.open_nursery() as nursery:
                nursery.start_soon(long)
                while not (Path(case["cwd"]) / "long-started").exists():
                    await trio.sleep(0.01)
                run = await shell.run_oneshot(case["short"], timeout_s=10)
                seen["short_stdout"] = run.stdout
                seen["during"] = {m: live(m) for m in case["markers"]}
                release.touch()  # the long call ends only now, however slow the machine
            seen["after"] = {m: live(m) for m in case["markers"]}
        seen["zombies"] = zombies()
    finally:
        await shell.aclose()
    print(json.dumps(seen))

trio.run(main)
"""


def run_child(case: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=json.dumps(case),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize("escape", list(ESCAPES), ids=list(ESCAPES))
@pytest.mark.parametrize("end", ["returns", "times out", "cancelled"])
def test_nothing_an_adopted_oneshot_starts_outlives_it(
    tmp_path: Path, escape: str, end: str
) -> None:
    sleep, marker = marker_sleep()
    started = ESCAPES[escape].format(sleep=sleep)
    seen = run_child(
        {"kind": "end", "cwd": str(tmp_path), "started": started, "end": end, "marker": marker}
    )
    assert seen["left"] == [], seen
    assert seen["zombies"] == [], seen
    if end == "returns":
        assert seen["stdout"] == "started\n"
    elif end == "times out":
        assert seen["timed_out"]
    else:
        assert seen["cancelled"]


def test_a_call_ending_beside_a_running_one_takes_only_what_it_can_attribute(
    tmp_path: Path,
) -> None:
    """The short call's double-forked orphan (still in its session) dies with it; its
    `setsid` orphan cannot be told from the long call's, so it lives until that one ends too.
    The long call's own background job is never touched by the short call's sweep."""
    in_session, in_session_m = marker_sleep()
    left_session, left_session_m = marker_sleep()
    own_job, own_job_m = marker_sleep()
    seen = run_child(
        {
            "kind": "concurrent",
            "cwd": str(tmp_path),
            "short": (
                f"( {in_session} >/dev/null 2>&1 & )\n"
                # It says when it has left the session, so the call cannot end first.
                f"( setsid sh -c 'touch left; exec {left_session}' >/dev/null 2>&1 & )\n"
                "until [ -e left ]; do sleep 0.01; done\necho short"
            ),
            "long": (
                f"{own_job} >/dev/null 2>&1 &\ntouch long-started\n"
                "until [ -e release ]; do sleep 0.02; done\nkill -0 $! && echo own job alive"
            ),
            "markers": [in_session_m, left_session_m, own_job_m],
        }
    )
    assert seen["short_stdout"] == "short\n"
    assert seen["long_stdout"] == "own job alive\n"
    assert seen["during"][in_session_m] == []
    assert seen["during"][left_session_m] != []
    assert seen["during"][own_job_m] != []
    assert seen["after"] == {in_session_m: [], left_session_m: [], own_job_m: []}
    assert seen["zombies"] == []
