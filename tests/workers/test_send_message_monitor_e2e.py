"""SendMessage and Monitor through the real `warren` CLI (issue 34, items 3 and 6): real pool
workers and tool hosts under the floor, the real SDK against the fake Messages API.

The main agent dispatches a `general` agent named `billing`, which reads a file and reports;
then it sends `billing` a follow-up with SendMessage: the agent's next request, in a fresh
worker, holds its whole earlier conversation (its prompt, its Read and the file's bytes, its
report) and then the follow-up, and its reply is the call's result. Then a background command
prints a few lines and `READY`, and a Monitor (`tail -f` of its output file piped to `grep
--line-buffered`, in the read-only sandbox) turns `READY` into an event the headless run waits
for; the main agent stops the monitor with TaskStop and ends. Nothing of the session is left.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
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
SHELL = "for i in 1 2 3; do echo step-$i; sleep 0.3; done; echo READY; sleep 0.5"


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path("/var/tmp") / f"warren-sm-{uuid.uuid4().hex[:10]}"
    (path / "ws").mkdir(parents=True)
    (path / "ws" / "ledger.txt").write_text("invoice 4711 is overdue\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _is_subagent(request: RecordedRequest) -> bool:
    return "dispatched by another agent" in json.dumps(request.system)


def _last(request: RecordedRequest) -> str:
    return json.dumps(request.messages[-1])


def _use(id: str, tool: str, **input: Any) -> Reply:
    return Reply(content=[{"type": "tool_use", "id": id, "name": tool, "input": input}])


def test_a_follow_up_continues_the_agent_and_a_monitor_reports_a_line(home: Path) -> None:
    ledger = home / "ws" / "ledger.txt"
    ids: dict[str, str] = {}

    def route(request: RecordedRequest) -> FakeResponse:
        last = _last(request)
        if _is_subagent(request):
            if "follow-up" in last:
                return Reply.text("It said invoice 4711 is overdue.")
            if len(request.messages) == 1:
                return _use("toolu_read", "Read", file_path=str(ledger))
            return Reply.text("report on billing: one overdue invoice")
        if len(request.messages) == 1:
            return _use(
                "toolu_dispatch",
                "dispatch_agent",
                description="survey billing",
                prompt="Read ledger.txt and report.",
                name="billing",
            )
        if "<events>" in last and "READY" in last and "stop" not in ids:
            ids["stop"] = ids["monitor"]
            return _use("toolu_stop", "TaskStop", task_id=ids["monitor"])
        if "toolu_dispatch" in last:
            return _use(
                "toolu_send", "SendMessage", to="billing", message="follow-up: which invoice?"
            )
        if "toolu_send" in last:
            return _use("toolu_shell", "Bash", command=SHELL, run_in_background=True)
        if "toolu_shell" in last:
            found = re.search(r"Output is being written to: (\S+?\.output)", last)
            assert found, last
            return _use(
                "toolu_monitor",
                "Monitor",
                description="wait for READY",
                timeout_ms=60_000,
                command=f"tail -n +1 -f {found[1]} | grep --line-buffered READY",
            )
        if "toolu_monitor" in last and "monitor" not in ids:
            found = re.search(r"ID: (monitor-[0-9a-f]+)", last)
            assert found, last
            ids["monitor"] = found[1]
            return Reply.text("Waiting for READY.")
        if "toolu_stop" in last:
            return Reply.text("Done: the server is ready.")
        return Reply.text("Still waiting.")

    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_STATE_HOME": str(home / "state"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "ANTHROPIC_API_KEY": "sk-test-sm",
        "PYTHONPATH": str(ROOT),
        "WARREN_NO_SERVER": "1",
    }
    with FakeMessagesAPI(route=route) as api:
        done = subprocess.run(
            [*WARREN, "-p", "go", "--cwd", str(home / "ws"), "--output-format", "json"],
            env={**env, "ANTHROPIC_BASE_URL": api.base_url},
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        requests = api.requests
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == "Done: the server is ready."

    # The follow-up went to the agent with its whole conversation, then the message.
    [follow_up] = [r for r in requests if _is_subagent(r) and "follow-up" in _last(r)]
    earlier = json.dumps(follow_up.messages[:-1])
    assert len(follow_up.messages) == 5, follow_up.messages
    assert "Read ledger.txt and report." in json.dumps(follow_up.messages[0])
    assert "toolu_read" in earlier and "invoice 4711 is overdue" in earlier
    assert "report on billing: one overdue invoice" in earlier
    main = [r for r in requests if not _is_subagent(r)]
    sent = next(r for r in main if "toolu_send" in _last(r))
    assert "It said invoice 4711 is overdue." in _last(sent)

    # The monitor's line reached the model as an event; TaskStop ended the watch.
    evented = next(r for r in main if "<events>" in _last(r))
    assert "READY" in _last(evented) and "<status>running</status>" in _last(evented)
    assert "step-1" not in _last(evented), "grep passed only the READY line"
    stopped = next(r for r in main if "toolu_stop" in _last(r))
    assert "was stopped" in _last(stopped) or "had already ended" in _last(stopped)

    left = [
        p.info["cmdline"]
        for p in psutil.process_iter(["cmdline"])
        if p.info["cmdline"] and str(home) in " ".join(p.info["cmdline"])
    ]
    assert left == []


def test_a_resumed_session_continues_an_agent_of_its_earlier_process(home: Path) -> None:
    """`--resume`: the agent `billing` of the session's first process is continued by name,
    its conversation read back from its transcript; a fork's could not be (its history began
    with its parent's)."""
    ledger = home / "ws" / "ledger.txt"

    def route(request: RecordedRequest) -> FakeResponse:
        last = _last(request)
        if _is_subagent(request):
            if "follow-up" in last:
                return Reply.text("Still: invoice 4711.")
            if len(request.messages) == 1:
                return _use("toolu_read", "Read", file_path=str(ledger))
            return Reply.text("report on billing: one overdue invoice")
        first = json.dumps(request.messages[0])
        if "survey" in first and len(request.messages) == 1:
            return _use("toolu_dispatch", "dispatch_agent", description="survey billing",
                        prompt="Read ledger.txt and report.", name="billing")  # fmt: skip
        if "ask again" in last:
            return _use("toolu_send", "SendMessage", to="billing", message="follow-up: which?")
        return Reply.text("ok")

    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_STATE_HOME": str(home / "state"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "ANTHROPIC_API_KEY": "sk-test-sm",
        "PYTHONPATH": str(ROOT),
        "WARREN_NO_SERVER": "1",
    }
    with FakeMessagesAPI(route=route) as api:
        env["ANTHROPIC_BASE_URL"] = api.base_url
        first = subprocess.run(
            [*WARREN, "-p", "survey", "--cwd", str(home / "ws"), "--output-format", "json"],
            env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert first.returncode == 0, first.stderr
        session_id = json.loads(first.stdout)["session_id"]
        again = subprocess.run(
            [*WARREN, "-p", "ask again", "--resume", session_id, "--cwd", str(home / "ws"),
             "--output-format", "json"],
            env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        requests = api.requests
    assert again.returncode == 0, again.stderr
    [follow_up] = [r for r in requests if _is_subagent(r) and "follow-up" in _last(r)]
    earlier = json.dumps(follow_up.messages[:-1])
    assert "Read ledger.txt and report." in earlier and "invoice 4711 is overdue" in earlier
    assert "report on billing: one overdue invoice" in earlier
    sent = next(r for r in requests if not _is_subagent(r) and "toolu_send" in _last(r))
    assert "Still: invoice 4711." in _last(sent)
