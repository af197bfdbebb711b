"""Background subagents through the real `warren` CLI (issue 34, item 1 and 2): real pool
workers under the floor, the real SDK against the fake Messages API.

The main agent starts three read-only agents with `run_in_background` and a fourth, named
`slow`, whose reply never comes. The fake API holds the three agents' replies until the main
agent's next request has arrived, so the overlap is proven by order, not by timing; the main
agent then stops `slow` with TaskStop and ends its turn. The headless run waits for the three
and gives the model their notifications (Claude Code's `<task-notification>`, with each report),
at turn boundaries; nothing of the session is left running afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
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
SURVEYS = ("billing", "catalog", "shipping")


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path("/var/tmp") / f"warren-bg-{uuid.uuid4().hex[:10]}"
    (path / "ws").mkdir(parents=True)
    (path / "ws" / "a.txt").write_text("a\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _is_subagent(request: RecordedRequest) -> bool:
    return "dispatched by another agent" in json.dumps(request.system)


def _token(request: RecordedRequest) -> str:
    content = request.messages[0]["content"]
    text = content if isinstance(content, str) else "".join(b.get("text", "") for b in content)
    return text.split()[-1]


def _dispatch(token: str, name: str | None = None) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": f"toolu_{token}",
        "name": "dispatch_agent",
        "input": {
            "description": f"survey {token}",
            "prompt": f"Survey the code. {token}",
            "run_in_background": True,
            **({"name": name} if name else {}),
        },
    }


def _notes(request: RecordedRequest) -> int:
    return json.dumps(request.messages).count("<task-id>")


def test_background_agents_overlap_the_main_agent_and_notify_it(home: Path) -> None:
    main_went_on = threading.Event()

    def route(request: RecordedRequest) -> FakeResponse:
        if _is_subagent(request):
            token = _token(request)
            if token == "slow":
                return Reply.text("never sent", hold_before_stop=True)
            assert main_went_on.wait(60), "the main agent's next request never came"
            return Reply.text(f"report on {token}")
        turn = len(request.messages)
        if turn == 1:
            calls = [_dispatch(t) for t in SURVEYS] + [_dispatch("slow", name="slow")]
            return Reply(content=calls)
        if turn == 3:
            main_went_on.set()  # the subagents' replies go out only now
            return Reply.tool_use("TaskStop", {"task_id": "slow"})
        if turn == 5:
            return Reply.text("The surveys run; I will wait for their reports.")
        if _notes(request) >= len(SURVEYS):
            return Reply.text("All three reported.")
        return Reply.text("Still waiting.")

    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_STATE_HOME": str(home / "state"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "ANTHROPIC_API_KEY": "sk-test-bg",
        "PYTHONPATH": str(ROOT),
        "WARREN_NO_SERVER": "1",
    }
    with FakeMessagesAPI(route=route) as api:
        done = subprocess.run(
            [*WARREN, "-p", "survey", "--cwd", str(home / "ws"), "--output-format", "json"],
            env={**env, "ANTHROPIC_BASE_URL": api.base_url},
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        requests = api.requests
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["result"] == "All three reported."

    main = [r for r in requests if not _is_subagent(r)]
    subs = [r for r in requests if _is_subagent(r)]
    # The dispatches returned at once: the main agent's second request came before any
    # survey's reply was sent.
    second = main[1]
    firsts = [r for r in subs if _token(r) in SURVEYS]
    assert len(firsts) == len(SURVEYS)
    assert all(r.ended_at is not None and second.started_at < r.ended_at for r in firsts)
    started = json.dumps(second.messages[-1])
    assert started.count("in the background") == len(SURVEYS) + 1, started
    stopped = json.dumps(main[2].messages[-1])
    assert "was stopped" in stopped, stopped

    # The notifications reached the model at turn boundaries, each with its report.
    last = json.dumps(main[-1].messages)
    assert last.count("<task-id>") == len(SURVEYS)
    for token in SURVEYS:
        assert f"report on {token}" in last
    assert "never sent" not in last and "<status>completed</status>" in last

    # Nothing of the session is left: no worker, no sandbox.
    left = [
        p.info["cmdline"]
        for p in psutil.process_iter(["cmdline"])
        if p.info["cmdline"] and str(home) in " ".join(p.info["cmdline"])
    ]
    assert left == []
