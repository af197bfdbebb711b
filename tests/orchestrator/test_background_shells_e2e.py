"""Background shells through the real `warren` CLI (issue 34, item 5): real tool hosts under
the floor, the real SDK against the fake Messages API.

The main agent starts two background commands: one that writes (`sleep 1; echo READY >
ready.txt`, in the read-write host) and an endless read-only loop (in the read-only host).
Each call returns at once with its task id and output file; the loop's output file is read
through the read-only sandbox (it sees the directory, read-only: a write there fails); TaskStop
ends the loop and its processes are gone from the host; the writer's end reaches the model as
a notification at a turn boundary; what it wrote is a change set of its own, named in the
change log; nothing of the session is left afterwards, its output directory included.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.kit.fake_api import FakeMessagesAPI, FakeResponse, RecordedRequest, Reply
from tests.kit.floor import needs_sandbox

pytestmark = needs_sandbox

ROOT = Path(__file__).resolve().parents[2]
WARREN = [sys.executable, "-m", "orchestrator.cli"]
LOOP = "while true; do echo tick-$((n++)); sleep 0.2137; done"
"""Its `sleep 0.2137` (and that sleep's parent, the loop's bash) is how the host finds it."""


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path("/var/tmp") / f"warren-bgsh-{uuid.uuid4().hex[:10]}"
    (path / "ws").mkdir(parents=True)
    (path / "ws" / "a.txt").write_text("a\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(home: Path, api: FakeMessagesAPI) -> dict[str, str]:
    return {
        **os.environ,
        "HOME": str(home),
        "XDG_STATE_HOME": str(home / "state"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "ANTHROPIC_API_KEY": "sk-test-bgsh",
        "ANTHROPIC_BASE_URL": api.base_url,
        "PYTHONPATH": str(ROOT),
        "WARREN_NO_SERVER": "1",
    }


def _results(request: RecordedRequest) -> list[dict[str, Any]]:
    content = request.messages[-1]["content"]
    return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]


def _text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [])


def _bash(id: str, command: str, **more: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": id, "name": "Bash", "input": {"command": command, **more}}


def test_background_shells_run_while_the_agent_goes_on(home: Path) -> None:
    seen: dict[str, Any] = {}

    def route(request: RecordedRequest) -> FakeResponse:
        turn = len(request.messages)
        if turn == 1:
            return Reply(
                content=[
                    _bash("toolu_w", "sleep 1; echo READY > ready.txt", run_in_background=True,
                          description="write ready"),
                    _bash("toolu_l", LOOP, run_in_background=True, description="tick loop",
                          dangerouslyDisableSandbox=True),
                ]
            )  # fmt: skip
        if turn == 3:
            texts = {b["tool_use_id"]: _text(b) for b in _results(request)}
            seen["started"] = texts
            loop_file = re.search(r"written to: (\S+)", texts["toolu_l"])
            assert loop_file is not None, texts
            seen["loop_file"] = loop_file.group(1)
            ids = {k: re.search(r"ID: (\S+)\.", v).group(1) for k, v in texts.items()}  # type: ignore[union-attr]
            seen["ids"] = ids
            return Reply(
                content=[
                    _bash("toolu_cat", f"sleep 0.6; cat {seen['loop_file']}"),
                    _bash("toolu_touch", f"echo x >> {seen['loop_file']}"),
                ]
            )
        if turn == 5:
            seen["read"] = {b["tool_use_id"]: _text(b) for b in _results(request)}
            seen["loop_pids"] = _pids_seen(LOOP, until_found=True)
            return Reply.tool_use("TaskStop", {"task_id": seen["ids"]["toolu_l"]})
        if turn == 7:
            seen["stopped"] = _text(_results(request)[0])
            seen["loop_pids_after"] = _pids_seen(LOOP, until_found=False)
            # A shell keeps no run waiting; a monitor does: until the writer's file is there,
            # and 3 s more for its notification (however loaded the machine).
            watch = "until [ -e ready.txt ]; do sleep 0.1; done; sleep 3"
            return Reply.tool_use("Monitor", {"description": "the writer", "command": watch})
        whole = json.dumps(request.messages)
        if f"<task-id>{seen['ids']['toolu_w']}</task-id>" in whole:
            seen["notes"] = whole
            return Reply.text("done")
        return Reply.text("waiting for the writer")

    with FakeMessagesAPI(route=route) as api:
        done = subprocess.run(
            [*WARREN, "-p", "go", "--cwd", str(home / "ws"), "--output-format", "json",
             "--permission-mode", "bypassPermissions"],
            env=_env(home, api), capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == "done", done.stdout

    started = seen["started"]
    assert "Command running in background with ID: bash-" in started["toolu_w"]
    assert "do not edit files it writes" in started["toolu_w"]
    assert "dangerouslyDisableSandbox is accepted and ignored" in started["toolu_l"]
    # The loop's output is there to read, through the read-only sandbox, and cannot be
    # written from it.
    assert "tick-0" in seen["read"]["toolu_cat"], seen["read"]
    assert "Read-only file system" in seen["read"]["toolu_touch"], seen["read"]
    # TaskStop ended the loop, every process of it.
    assert seen["loop_pids"], "the loop was not running"
    assert "was stopped" in seen["stopped"]
    assert seen["loop_pids_after"] == []
    # The writer's end reached the model at a turn boundary, as a notification.
    notes = seen["notes"]
    assert "<task-notification>" in notes and "completed (exit code 0)" in notes
    assert f"<task-id>{seen['ids']['toolu_l']}</task-id>" not in notes  # a stopped task: none
    assert (home / "ws" / "ready.txt").read_text() == "READY\n"

    # What the writer wrote is its own change set, naming it.
    logs = list((home / "state").rglob("*.changes.jsonl"))
    assert len(logs) == 1
    records = [json.loads(line) for line in logs[0].read_text().splitlines()]
    writers = [w for r in records for w in r.get("writers", [])]
    mine = [w for w in writers if w["id"] == seen["ids"]["toolu_w"]]
    assert mine and mine[0]["kind"] == "Bash (background)" and mine[0]["paths"] == ["ready.txt"]

    # Nothing of the session is left: no process, no output file.
    assert not Path(seen["loop_file"]).exists()
    left = [
        p.info["cmdline"]
        for p in psutil.process_iter(["cmdline"])
        if p.info["cmdline"] and str(home) in " ".join(p.info["cmdline"])
    ]
    assert left == []
    assert _pids_running(LOOP) == []


def _pids_seen(command: str, *, until_found: bool) -> list[int]:
    """The loop's processes, looked for over a while (a loaded machine may be between two
    sleeps at any one look): until some are found (at most 10 s), or every 50 ms for 1 s
    (longer than the loop's sleep), all that were seen."""
    seen: set[int] = set()
    deadline = time.monotonic() + (10.0 if until_found else 1.0)
    while time.monotonic() < deadline:
        seen.update(_pids_running(command))
        if seen and until_found:
            break
        time.sleep(0.05)
    return sorted(seen)


def _pids_running(command: str) -> list[int]:
    """The loop's processes on the host: each `sleep 0.2137` and its parent bash."""
    pids: set[int] = set()
    for proc in psutil.process_iter(["cmdline", "ppid"]):
        if proc.info["cmdline"] == ["sleep", "0.2137"]:
            pids.update((proc.pid, proc.info["ppid"]))
    return sorted(pids)
