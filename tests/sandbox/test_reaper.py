"""No zombie under a coordinator that is PID 1 (issue 9, item 15).

A test process is run as PID 1 of a new pid namespace (`unshare --pid --fork --mount-proc`,
as root), the way a coordinator runs as PID 1 of a container: it runs sandboxed commands that
leave double-forked and `setsid` orphans, one that times out and one that is cancelled, then
lists every process left in its namespace. With the reaper none remains; without it (the same
script with reaping switched off) bwrap's init is left as a zombie, so the test can fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import psutil, trio
    import sandbox.run
    from sandbox.run import run_sandboxed
    from sandbox.spec import Limits, SandboxSpec, WorkspaceRoot

    if sys.argv[2] == "off":
        async def no_reaping(timeout_s):
            return []
        sandbox.run.reap_adopted_sandbox_inits = no_reaping

    ORPHANS = "(setsid sleep 1000 &); (sleep 1000 &); nohup sleep 1000 >/dev/null 2>&1 &"

    async def main():
        spec = SandboxSpec(
            workspaces=(WorkspaceRoot(path=Path(sys.argv[1]), mode="ro"),),
            limits=Limits(wall_time_s=2),
        )
        done = await run_sandboxed(spec, ["bash", "-c", ORPHANS + " echo done"])
        timed_out = await run_sandboxed(spec, ["bash", "-c", ORPHANS + " sleep 100"])
        with trio.move_on_after(0.5):
            await run_sandboxed(spec, ["bash", "-c", ORPHANS + " sleep 100"])
        left = [
            {"pid": p.pid, "name": p.name(), "status": p.status()}
            for p in psutil.process_iter()
            if p.pid != 1
        ]
        print(json.dumps({"done": done.stdout.decode(), "timed_out": timed_out.timed_out,
                          "left": left}))

    trio.run(main)
    """
)


def _run_as_pid_1(workspace: Path, reaping: str) -> dict[str, object]:
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        pytest.skip("needs unshare and root to run a process as PID 1 of a new pid namespace")
    root = Path(__file__).resolve().parents[2]
    args = (str(workspace), reaping)
    proc = subprocess.run(
        [unshare, "--pid", "--fork", "--mount-proc", sys.executable, "-c", SCRIPT, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        check=False,
    )
    if proc.returncode != 0 and "unshare" in proc.stderr:
        pytest.skip(f"unshare failed: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("reaping", ["on", "off"])
def test_no_zombie_under_a_pid_1_coordinator(scratch: Path, reaping: str) -> None:
    result = _run_as_pid_1(scratch, reaping)
    assert result["done"] == "done\n"
    assert result["timed_out"] is True
    left = result["left"]
    assert isinstance(left, list)
    if reaping == "on":
        assert left == [], left
    else:  # the reaper is what makes the difference
        assert any(p["status"] == "zombie" and p["name"] == "bwrap" for p in left), left
