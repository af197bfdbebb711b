"""A fork of the main agent through the real `warren` CLI (issue 34, item 4): a real pool
worker under the floor, the real SDK against the fake Messages API.

The main agent reads a file, then forks (`dispatch_agent(subagent_type="fork")`). The fork's
first request is the main agent's last request continued: its body starts with that
request's bytes (the same model, limits, system prompt and tools, the same messages with the
cache breakpoints where they were), then the main agent's reply up to the fork's call, a result
for each of its calls, and the task. The fork runs read-only (a write fails in its sandbox);
its report is the dispatch's result.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
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
TASK = "Check whether invoice 4711 is listed twice. [fork-task]"


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path("/var/tmp") / f"warren-fork-{uuid.uuid4().hex[:10]}"
    (path / "ws").mkdir(parents=True)
    (path / "ws" / "ledger.txt").write_text("invoice 4711 is overdue\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _is_fork(request: RecordedRequest) -> bool:
    """The fork's requests hold the result only it is given for its call."""
    return "Forked: this conversation" in json.dumps(request.messages)


def _breakpoints(messages: list[dict[str, Any]]) -> list[int]:
    return [i for i, m in enumerate(messages) if "cache_control" in json.dumps(m)]


def test_a_fork_starts_with_the_main_agents_last_request(home: Path) -> None:
    ledger = home / "ws" / "ledger.txt"

    def route(request: RecordedRequest) -> FakeResponse:
        if _is_fork(request):
            if len(request.messages) == 5:
                return Reply.tool_use("Write", {"file_path": str(ledger), "content": "gone\n"})
            return Reply.text("fork report: listed once")
        turn = len(request.messages)
        if turn == 1:
            return Reply.tool_use("Read", {"file_path": str(ledger)})
        if turn == 3:
            return Reply(
                content=[
                    {"type": "text", "text": "I will have a fork check it."},
                    {
                        "type": "tool_use",
                        "id": "toolu_fork",
                        "name": "dispatch_agent",
                        "input": {
                            "subagent_type": "fork",
                            "description": "check the ledger",
                            "prompt": TASK,
                        },
                    },
                ]
            )
        return Reply.text("Done.")

    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_STATE_HOME": str(home / "state"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "ANTHROPIC_API_KEY": "sk-test-fork",
        "ANTHROPIC_BASE_URL": "",
        "PYTHONPATH": str(ROOT),
        "WARREN_NO_SERVER": "1",
    }
    with FakeMessagesAPI(route=route) as api:
        done = subprocess.run(
            [*WARREN, "-p", "check the ledger", "--cwd", str(home / "ws"),
             "--output-format", "json", "--permission-mode", "bypassPermissions"],
            env={**env, "ANTHROPIC_BASE_URL": api.base_url},
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        requests = api.requests
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == "Done."

    main = [r for r in requests if not _is_fork(r)]
    forks = [r for r in requests if _is_fork(r)]
    parent = next(r for r in main if len(r.messages) == 3)
    first = forks[0]
    # Byte for byte: the parent's body without its closing `]}` starts the fork's.
    assert parent.raw.endswith(b"]}")
    assert first.raw.startswith(parent.raw[:-2]), "the fork's body does not start as the parent's"
    assert first.body["tools"] == parent.body["tools"] and first.system == parent.system
    assert first.body["max_tokens"] == parent.body["max_tokens"]
    # The breakpoints stay where the parent had them (its last two messages).
    assert _breakpoints(parent.messages) == [1, 2] == _breakpoints(first.messages)
    # Then the parent's reply up to the fork's call, its result, and the task.
    assert len(first.messages) == 5
    turn, start = first.messages[3], first.messages[4]
    assert turn["role"] == "assistant" and json.dumps(turn).count("toolu_fork") == 1
    assert "I will have a fork check it." in json.dumps(turn)
    results = [b for b in start["content"] if b.get("type") == "tool_result"]
    assert [b["tool_use_id"] for b in results] == ["toolu_fork"]
    assert "Forked" in json.dumps(results) and TASK in json.dumps(start)
    # Its second request keeps the last-two breakpoints of any conversation.
    second = forks[1]
    assert _breakpoints(second.messages) == [len(second.messages) - 2, len(second.messages) - 1]
    # Read-only: its write failed in the sandbox, and the file is as it was.
    assert "gone" not in ledger.read_text()
    write_result = json.dumps(second.messages[-1])
    assert '"is_error": true' in write_result, write_result
    # Its report is the dispatch's result.
    reported = next(r for r in main if len(r.messages) == 5)
    assert "fork report: listed once" in json.dumps(reported.messages[-1])
