"""Claude Code's spellings at Warren's command line (issue 16, item 1), with the real `warren`
process, the real sandbox and the real SDK against the fake Messages API: they do what
Warren's spellings do, and a flag Warren lacks is an error naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.kit.fake_api import FakeMessagesAPI, Reply
from tests.kit.floor import needs_sandbox

ROOT = Path(__file__).resolve().parents[2]
WARREN = [sys.executable, "-m", "orchestrator.cli"]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))},
        "HOME": str(home),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "ANTHROPIC_API_KEY": "sk-test-e2e",
        "PYTHONPATH": str(ROOT),
    }


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


def warren(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*WARREN, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def _events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def _test_and_edit(workspace: Path) -> list[Reply]:
    """The model writes a file and runs the tests with the wildcard-allowed command."""
    calls = Reply(
        content=[
            {
                "type": "tool_use",
                "name": "Write",
                "input": {"file_path": str(workspace / "notes.txt"), "content": "done\n"},
            },
            {
                "type": "tool_use",
                "name": "Bash",
                "input": {"command": "python3 -m pytest --co -q nothing_here"},
            },
        ]
    )
    return [calls, Reply.text("Ran the tests.")]


SESSION_ID = "0b5f3a3e-6a43-4a8e-9d55-1c2b3d4e5f60"


@needs_sandbox
def test_claude_code_spellings_behave_as_warrens(workspace: Path, env: dict[str, str]) -> None:
    """Acceptance: `--allowedTools "Bash(python3 -m pytest *)" --permission-mode acceptEdits
    --model sonnet` runs the Write (accept-edits) and the Bash (the wildcard rule matches),
    sends the real model id, and ends as the run with Warren's spellings does. The same run
    carries the other flags an SDK passes: the system prompt replaced and appended to, the
    tools offered, the session's id. The other takes its model from ANTHROPIC_MODEL."""
    runs = {
        "claude code": [
            "--allowedTools", "Bash(python3 -m pytest *)",
            "--permission-mode", "acceptEdits", "--model", "sonnet",
            "--system-prompt", "You are terse.", "--append-system-prompt", "Say done.",
            "--tools", "Write,Bash,Read", f"--session-id={SESSION_ID}",
        ],
        "warren": [
            "--allowed-tools", "Bash(python3 -m pytest:*)",
            "--permission-mode", "accept-edits",
        ],
    }  # fmt: skip
    # The model from the environment, as Claude Code takes it: an alias, repointed.
    model_env = {
        "claude code": {},
        "warren": {"ANTHROPIC_MODEL": "haiku", "ANTHROPIC_SMALL_FAST_MODEL": "claude-haiku-9"},
    }
    models = {"claude code": "claude-sonnet-4-6", "warren": "claude-haiku-9"}
    outcomes = {}
    requests = {}
    for name, flags in runs.items():
        (workspace / "notes.txt").unlink(missing_ok=True)
        with FakeMessagesAPI(_test_and_edit(workspace)) as api:
            done = warren(
                ["-p", "run the tests", "--cwd", str(workspace), "--output-format",
                 "stream-json", *flags],
                {**env, **model_env[name], "ANTHROPIC_BASE_URL": api.base_url},
            )  # fmt: skip
            requests[name] = [request.body for request in api.requests]
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
        events = _events(done.stdout)
        result = events[-1]
        assert result["type"] == "result"
        assert result["permission_denials"] == [], name
        assert (workspace / "notes.txt").read_text() == "done\n", name
        assert {body["model"] for body in requests[name]} == {models[name]}, name
        outcomes[name] = (result["subtype"], result["num_turns"], len(events))
        if name == "claude code":
            assert result["session_id"] == SESSION_ID
    assert outcomes["claude code"] == outcomes["warren"]

    claude, warrens = requests["claude code"][0], requests["warren"][0]
    system = [block["text"] for block in claude["system"]]
    assert system[:2] == ["You are terse.", "Say done."]
    assert warrens["system"][0]["text"] not in system  # Warren's base prompt is replaced
    assert len(system) == len(warrens["system"]) + 1  # the workspace context still follows
    assert {tool["name"] for tool in claude["tools"]} == {"Write", "Bash", "Read"}
    assert "Edit" in {tool["name"] for tool in warrens["tools"]}


def test_a_claude_code_flag_warren_lacks_is_an_error_naming_it(env: dict[str, str]) -> None:
    done = warren(["-p", "hi", "--effort", "high"], env)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        "warren: error: --effort is a Claude Code flag Warren does not support (effort levels)"
    )
