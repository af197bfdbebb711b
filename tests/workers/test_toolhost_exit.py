"""A tool host that has served leaves at once: no interpreter teardown after `serve` (the
session's exit waits for its hosts), so nothing registered to run at exit runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_RUN_AS_MAIN = """
import atexit, runpy, sys
marker = sys.argv[1]
atexit.register(lambda: open(marker, "w").write("torn down"))
sys.argv = ["workers.toolhost", "--role", "read_only", "--workspace", sys.argv[2]]
runpy.run_module("workers.toolhost", run_name="__main__")
"""


def test_a_host_exits_without_interpreter_teardown(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    # Stdin at end of file: the host starts, sends Ready, serves nothing, and exits.
    done = subprocess.run(
        [sys.executable, "-c", _RUN_AS_MAIN, str(marker), str(tmp_path)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert b'"type":"ready"' in done.stdout
    assert b'"tool host stopped"' in done.stderr  # its last log line, flushed
    assert not marker.exists()
