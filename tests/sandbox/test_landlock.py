"""`restrict_writes` on the host, in a child process each (the restriction cannot be lifted):
what it refuses leaves the process unrestricted; what it grants, a child shell keeps. The
attacks themselves (other scopes, renames, hard links, `/proc/self/root`, symlinks, `..`) run
through the real pool in tests/workers/test_scoped_writers_e2e.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.landlock import MIN_ABI, abi, write_rights

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(abi() < MIN_ABI, reason=f"no Landlock ABI {MIN_ABI}")

_SCRIPT = """
import os, subprocess, sys, threading
from pathlib import Path
from sandbox.landlock import restrict_writes

scope, outside, link = (Path(p) for p in sys.argv[1:4])

def attempt(what, *args, **kwargs):
    try:
        restrict_writes(*args, **kwargs)
    except OSError as exc:
        print(what, "refused:", exc)

stop = threading.Event()
thread = threading.Thread(target=stop.wait)
thread.start()
attempt("thread", [scope])
stop.set()
thread.join()
while len(os.listdir("/proc/self/task")) > 1:  # a joined thread's task ends just after
    os.sched_yield()
child = subprocess.Popen(["sleep", "30"])
attempt("child", [scope])
child.kill()
child.wait()
attempt("symlink", [link])
(outside / "still_free").write_text("x")  # nothing was restricted so far
restrict_writes([scope], scratch=())  # tmp_path is under /tmp, a scratch directory
shell = "echo in > {0}/in && echo x > /dev/null && echo out > {1}/out".format
print("shell:", subprocess.run(["sh", "-c", shell(scope, outside)],
      capture_output=True, text=True).stderr.strip())
"""


def test_refusals_restrict_nothing_and_a_child_shell_keeps_the_grant(tmp_path: Path) -> None:
    scope, outside = tmp_path / "scope", tmp_path / "outside"
    scope.mkdir()
    outside.mkdir()
    (outside / "sub").mkdir()
    (tmp_path / "link").symlink_to(outside)
    via_link = tmp_path / "link" / "sub"  # a symlink on the way, not at the end
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(scope), str(outside), str(via_link)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "thread refused: the process has 2 threads" in out, out
    assert "child refused: the process has children" in out, out
    assert "symlink refused:" in out and "not where its name says" in out, out
    assert (outside / "still_free").exists()
    assert (scope / "in").read_text() == "in\n"
    assert not (outside / "out").exists()
    assert "out: Permission denied" in out, out


def test_the_handled_rights_grow_with_the_abi() -> None:
    assert write_rights(1) & (1 << 13) == 0  # no REFER before ABI 2
    assert write_rights(2) & (1 << 13)
    assert write_rights(7) == write_rights(5) == write_rights(2) | (1 << 14) | (1 << 15)
    assert write_rights(7) & 0b1101 == 0  # never execute, read a file or read a directory
