"""A workspace wipe hidden in text the shell evaluates later is asked about in bypass mode
(issue 33, class 6), through the real `warren` CLI: real sandboxes, the real SDK against the
fake Messages API. Headless, the ask is a denial with the reason; the workspace is untouched
on the host. An ordinary counter loop still runs unasked."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kit.fake_api import FakeMessagesAPI, Reply
from tests.kit.floor import needs_sandbox

pytestmark = needs_sandbox

ROOT = Path(__file__).resolve().parents[2]
WARREN = [sys.executable, "-m", "orchestrator.cli"]
WIPES = (
    "x='a[$(rm -rf \"$PWD\"/*)]'; echo $((x))",
    "x='a[$(rm -rf \"$PWD\"/*)]'; [[ $x -eq 0 ]]",
    "v='rm -rf \"$PWD\"/*'; eval \"$v\"",
    "echo cm0gLXJmICIkUFdEIi8q | base64 -d | sh",
)


@pytest.fixture
def place() -> Iterator[Path]:
    root = Path("/var/tmp") / f"warren-hidden-{uuid.uuid4().hex[:10]}"
    (root / "ws").mkdir(parents=True)
    (root / "ws" / "keep.txt").write_text("work\n")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_hidden_wipes_are_denied_in_bypass_mode_and_a_counter_loop_runs(place: Path) -> None:
    calls = [*WIPES, "i=0; while [ $i -lt 3 ]; do i=$((i+1)); done; echo counted $i"]
    replies = [
        Reply(content=[{"type": "tool_use", "id": f"toolu_{n}", "name": "Bash",
                        "input": {"command": command}}])
        for n, command in enumerate(calls)
    ] + [Reply.text("done")]  # fmt: skip
    with FakeMessagesAPI(replies) as api:
        done = subprocess.run(
            [*WARREN, "-p", "clean up", "--cwd", str(place / "ws"), "--output-format", "json",
             "--permission-mode", "bypass"],
            env={**os.environ, "HOME": str(place), "XDG_STATE_HOME": str(place / "state"),
                 "ANTHROPIC_API_KEY": "sk-test", "ANTHROPIC_BASE_URL": api.base_url,
                 "PYTHONPATH": str(ROOT), "WARREN_NO_SERVER": "1"},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        last = api.requests[-1]
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    denied = [d["tool_input"]["command"] for d in result["permission_denials"]]
    assert denied == list(WIPES)
    assert (place / "ws" / "keep.txt").read_text() == "work\n"
    results = [
        json.dumps(block["content"])
        for message in last.messages
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]
    assert "counted 3" in results[-1], results[-1]
    assert all("critical delete" in text for text in results[:-1]), results
