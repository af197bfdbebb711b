"""Output limits through the real `warren` CLI: model aliases, per-model `max_tokens`,
`--max-thinking-tokens`, and a reply that stays cut ending `output_truncated` (exit 9).
A real process, the real SDK over a real socket to the fake Messages API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.conversation.continuation import CONTINUE_PROMPT
from tests.kit.fake_api import FakeMessagesAPI, FakeResponse, RecordedRequest, Reply

ROOT = Path(__file__).resolve().parents[2]
WARREN = [sys.executable, "-m", "orchestrator.cli"]
CUT = {"stop_reason": "max_tokens"}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


def warren(
    args: list[str], replies: list[FakeResponse], workspace: Path
) -> tuple[subprocess.CompletedProcess[str], list[RecordedRequest]]:
    with FakeMessagesAPI(replies) as api:
        done = subprocess.run(
            [*WARREN, "-p", "write the essay", "--cwd", str(workspace), *args],
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "XDG_STATE_HOME": str(workspace.parent / "state"),
                "ANTHROPIC_API_KEY": "sk-test-e2e",
                "ANTHROPIC_BASE_URL": api.base_url,
            },
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        return done, api.requests


@pytest.mark.parametrize(
    ("model", "sent", "max_tokens"),
    [
        ("sonnet", "claude-sonnet-4-6", 32_000),
        ("claude-fable-9", "claude-fable-9", 32_000),  # unknown: the conservative defaults
    ],
)
def test_the_model_option_resolves_aliases_and_sets_max_tokens(
    workspace: Path, model: str, sent: str, max_tokens: int
) -> None:
    done, requests = warren(["--model", model], [Reply.text("hi")], workspace)
    assert done.returncode == 0, done.stderr
    assert (requests[0].body["model"], requests[0].body["max_tokens"]) == (sent, max_tokens)
    assert "thinking" not in requests[0].body


def test_max_thinking_tokens_turns_on_extended_thinking(workspace: Path) -> None:
    thinking = {"type": "thinking", "thinking": "Plan first.", "signature": "c2ln"}
    done, requests = warren(
        ["--max-thinking-tokens", "10000", "--output-format", "json"],
        [Reply(content=[thinking, {"type": "text", "text": "hi"}])],
        workspace,
    )
    assert done.returncode == 0, done.stderr
    assert requests[0].body["thinking"] == {"type": "enabled", "budget_tokens": 10_000}
    assert requests[0].body["max_tokens"] == 32_000
    assert json.loads(done.stdout)["result"] == "hi"


def test_a_thinking_budget_below_the_api_minimum_is_a_usage_error(workspace: Path) -> None:
    done, requests = warren(["--max-thinking-tokens", "100"], [], workspace)
    assert done.returncode == 2 and requests == []
    assert "max_thinking_tokens" in done.stderr and "Traceback" not in done.stderr


def test_a_continued_answer_is_printed_whole(workspace: Path) -> None:
    done, requests = warren([], [Reply.text("Half ", **CUT), Reply.text("and half.")], workspace)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Half and half.\n"
    assert requests[1].messages[-1]["content"][0]["text"] == CONTINUE_PROMPT


def test_a_reply_that_stays_cut_exits_9_never_completed(workspace: Path) -> None:
    replies: list[FakeResponse] = [Reply.text(f"part {i}. ", **CUT) for i in range(4)]
    done, _ = warren(["--output-format", "json"], replies, workspace)
    assert done.returncode == 9, done.stderr
    result = json.loads(done.stdout)
    assert result["terminal_reason"] == "output_truncated" and result["is_error"] is True
    assert result["result"] == "part 0. part 1. part 2. part 3. "

    done, _ = warren([], replies, workspace)
    assert done.returncode == 9
    assert done.stdout == "part 0. part 1. part 2. part 3. \n"
    assert "Traceback" not in done.stderr
    assert "output_truncated" in done.stderr.strip().splitlines()[-1]
