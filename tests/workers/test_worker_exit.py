"""A tool host or agent worker that has served leaves at once: no interpreter teardown after
`serve` (the session's exit and the pool's stop of a worker wait for it), so nothing
registered to run at exit runs; its last log line is still out (`workers.entry.exit_now`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_RUN_AS_MAIN = """
import atexit, runpy, sys
module, marker, workspace = sys.argv[1:4]
atexit.register(lambda: open(marker, "w").write("torn down"))
sys.argv = [module, "--role", "read_write", "--workspace", workspace]
runpy.run_module(module, run_name="__main__")
"""


@pytest.mark.parametrize(
    ("module", "last_line"),
    [("workers.toolhost", b'"tool host stopped"'), ("workers.agent_worker", b'"agent worker')],
)
def test_a_worker_exits_without_interpreter_teardown(
    tmp_path: Path, module: str, last_line: bytes
) -> None:
    marker = tmp_path / "marker"
    # Stdin at end of file: the process starts, sends Ready, serves nothing, and exits.
    done = subprocess.run(
        [sys.executable, "-c", _RUN_AS_MAIN, module, str(marker), str(tmp_path)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert b'"type":"ready"' in done.stdout
    assert last_line in done.stderr  # its log lines, flushed
    assert not marker.exists()
