"""Where background tasks show (issue 34, item 8), through the real `warren` CLI against the
fake Messages API: stream-json's `task_started`, `task_progress` and `task_notification` as
Claude Code 2.1 emits them (a background shell, a monitor, a background agent), the audit log's
`task` lines, `warren sessions`' TASKS column; and a session whose process was killed with
tasks running says, when resumed, which tasks ended with it (on stderr and to the model), once.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kit.fake_api import FakeMessagesAPI, FakeResponse, RecordedRequest, Reply
from tests.kit.floor import needs_sandbox

pytestmark = needs_sandbox

ROOT = Path(__file__).resolve().parents[2]
WARREN = [sys.executable, "-m", "orchestrator.cli"]


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path("/var/tmp") / f"warren-shown-{uuid.uuid4().hex[:10]}"
    (path / "ws").mkdir(parents=True)
    (path / "ws" / "a.txt").write_text("alpha\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(home: Path, api: FakeMessagesAPI) -> dict[str, str]:
    return {
        **os.environ,
        "HOME": str(home),
        "XDG_STATE_HOME": str(home / "state"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "ANTHROPIC_API_KEY": "sk-test-shown",
        "ANTHROPIC_BASE_URL": api.base_url,
        "PYTHONPATH": str(ROOT),
        "WARREN_NO_SERVER": "1",
    }


def _use(id: str, tool: str, **input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": id, "name": tool, "input": input}


def _is_subagent(request: RecordedRequest) -> bool:
    return "dispatched by another agent" in json.dumps(request.system)


def test_stream_json_the_audit_log_and_sessions_show_each_task(home: Path) -> None:
    ledger = home / "ws" / "a.txt"

    def route(request: RecordedRequest) -> FakeResponse:
        if _is_subagent(request):
            if len(request.messages) == 1:
                return Reply.tool_use("Read", {"file_path": str(ledger)})
            return Reply.text("survey report")
        if len(request.messages) == 1:
            return Reply(
                content=[
                    _use("toolu_sh", "Bash", command="echo shell-line",
                         run_in_background=True, description="say a line"),
                    _use("toolu_mon", "Monitor", description="count",
                         command="for i in 1 2; do echo mon-$i; done"),
                    _use("toolu_ag", "dispatch_agent", description="survey", prompt="Survey.",
                         run_in_background=True),
                ]
            )  # fmt: skip
        if "survey report" in json.dumps(request.messages) and "mon-2" in json.dumps(
            request.messages
        ):
            return Reply.text("All reported.")
        return Reply.text("Waiting.")

    with FakeMessagesAPI(route=route) as api:
        env = _env(home, api)
        done = subprocess.run(
            [*WARREN, "-p", "go", "--cwd", str(home / "ws"), "--output-format", "stream-json",
             "--verbose"],
            env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    tasks = [r for r in lines if r.get("subtype", "").startswith("task_")]
    started = {r["task_id"]: r for r in tasks if r["subtype"] == "task_started"}
    ended = {r["task_id"]: r for r in tasks if r["subtype"] == "task_notification"}
    progress = [r for r in tasks if r["subtype"] == "task_progress"]
    kinds = sorted(r["task_type"] for r in started.values())
    assert kinds == ["local_agent", "local_bash", "monitor"], started
    assert all(r["is_backgrounded"] for r in started.values())
    assert set(ended) == set(started), (started, ended)
    shell = next(t for t, r in started.items() if r["task_type"] == "local_bash")
    assert ended[shell]["status"] == "completed" and ended[shell]["output_file"].endswith(
        f"{shell}.output"
    )
    assert started[shell]["tool_use_id"] == "toolu_sh"
    monitor = next(t for t, r in started.items() if r["task_type"] == "monitor")
    assert [r["summary"] for r in progress if r["task_id"] == monitor] == ["mon-1", "mon-2"]
    agent = next(t for t, r in started.items() if r["task_type"] == "local_agent")
    [agent_progress] = [r for r in progress if r["task_id"] == agent]
    assert agent_progress["last_tool_name"] == "Read"
    assert agent_progress["usage"]["tool_uses"] == 1
    assert ended[agent]["status"] == "completed" and ended[agent]["summary"] == "survey report"
    session_id = lines[0]["session_id"]

    [audit] = (home / "state").rglob(f"{session_id}.audit.jsonl")
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    audited = [(r["phase"], r["task_kind"]) for r in records if r["kind"] == "task"]
    assert sorted(audited) == sorted(
        [(p, k) for p in ("started", "ended") for k in ("agent", "shell", "monitor")]
    )

    listed = subprocess.run(
        [*WARREN, "sessions", "--cwd", str(home / "ws")],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()[:2]
    assert header.split()[4] == "TASKS"
    assert re.split(r"\s{2,}", row.strip())[4] == "3"


def test_a_resumed_session_says_which_tasks_ended_with_its_killed_process(home: Path) -> None:
    first_run: dict[str, Any] = {}

    def route(request: RecordedRequest) -> FakeResponse:
        text = json.dumps(request.messages)
        if "go on" in text:
            first_run["resumed"] = text
            return Reply.text("Noted.")
        if len(request.messages) == 1:
            return Reply.tool_use(
                "Bash",
                {"command": "while true; do sleep 0.3117; done", "run_in_background": True,
                 "description": "dev server"},
            )  # fmt: skip
        return Reply.text("never sent", hold_before_stop=True)

    with FakeMessagesAPI(route=route) as api:
        env = _env(home, api)
        process = subprocess.Popen(
            [*WARREN, "-p", "start it", "--cwd", str(home / "ws"),
             "--output-format", "stream-json", "--verbose"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert process.stdout is not None
        session_id = json.loads(process.stdout.readline())["session_id"]
        deadline = time.monotonic() + 60
        while len(api.requests) < 2:
            assert time.monotonic() < deadline, "the second request never came"
            time.sleep(0.05)
        process.kill()  # SIGKILL: no task is told it ends
        process.communicate(timeout=30)
        assert process.returncode == -signal.SIGKILL
        api.release()

        resumed = subprocess.run(
            [*WARREN, "-p", "go on", "--resume", session_id, "--cwd", str(home / "ws"),
             "--output-format", "json"],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr
        said = re.search(r"background tasks that ended with the session's previous process: "
                         r"(bash-[0-9a-f]+) \(dev server\)", resumed.stderr)  # fmt: skip
        assert said, resumed.stderr
        told = first_run["resumed"]
        assert f"<task-id>{said[1]}</task-id>" in told and "<status>stopped</status>" in told
        assert "ended with the session&#x27;s previous process" in told or (
            "ended with the session's previous process" in told
        )

        again = subprocess.run(
            [*WARREN, "-p", "go on", "--resume", session_id, "--cwd", str(home / "ws"),
             "--output-format", "json"],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "previous process" not in again.stderr, "told once, not at every resume"
