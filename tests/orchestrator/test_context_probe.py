"""The context probe's own start-up cost and its hand-made pieces: it starts in every session's
read-only sandbox before the first model request, so it imports no more than it needs (no
`json`, no `subprocess`), and what replaces them behaves as they did."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.conversation import context_probe

PROBE = Path(context_probe.__file__)

_RUN_AS_SCRIPT = """
import sys
path, cwd = sys.argv[1], sys.argv[2]
sys.argv = [path, cwd, cwd, '[["/nowhere", "a/**", true, "^a/.*$"]]']
exec(compile(open(path).read(), path, "exec"), {"__name__": "__main__", "__file__": path})
sys.stderr.write(" ".join(sorted(sys.modules)))
"""


def test_the_sandboxed_probe_imports_neither_json_nor_subprocess(tmp_path: Path) -> None:
    """Run as the sandbox runs it (`python -I -S`): its answer is whole, and none of the
    modules that made up two thirds of its time was loaded on the way."""
    import subprocess

    (tmp_path / "a.txt").write_text("x")
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _RUN_AS_SCRIPT, str(PROBE), str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    facts = json.loads(done.stdout)
    assert facts["tree"] == "- a.txt"
    assert facts["branch"] is None  # not a repository: git said so
    loaded = set(done.stderr.split())
    assert not {"json", "subprocess", "re", "enum", "signal", "threading"} & loaded


_facts = st.recursive(
    st.none() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=50)
@given(_facts)
def test_the_probe_writes_the_json_that_json_writes(value: object) -> None:
    assert context_probe._dumps(value) == json.dumps(value)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=50)
@given(_json_values)
def test_the_probe_reads_the_json_that_json_reads(value: object) -> None:
    text = json.dumps(value)
    assert context_probe._loads(text) == json.loads(text)
    with pytest.raises(ValueError):
        context_probe._loads(text + " 1")


def test_a_git_that_hangs_is_killed_at_its_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`git status` that never ends (a huge or hostile repository) costs the snapshot its
    status, not the session its start: killed at the deadline, the branch still reported."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pids = tmp_path / "pids"
    fake = bin_dir / "git"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo $$ >> "{pids}"\n'
        'for arg in "$@"; do [ "$arg" = status ] && exec sleep 60; done\n'
        "echo main\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(context_probe, "GIT_TIMEOUT_S", 0.5)
    started = time.monotonic()
    facts = context_probe.collect(tmp_path)
    assert time.monotonic() - started < 30  # not the 60 s of the hanging status
    assert facts["branch"] == "main"
    assert facts["status"] is None
    for pid in pids.read_text().split():
        assert not psutil.pid_exists(int(pid))  # killed and reaped
