"""The official Claude Agent SDK (claude-agent-sdk from PyPI, pinned in the dev dependencies)
drives Warren through `cli_path`, as it drives Claude Code (issue 16, item 7): the real SDK
spawns the real `warren` process, which runs the real Anthropic SDK against the fake Messages
API, under the real sandbox. The SDK's `can_use_tool` decides what Warren's policy asks about:
its allow runs the Edit, its deny keeps the Write from being made and its message reaches the
model; a rewritten input that a deny rule forbids is still denied."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
from claude_agent_sdk import (
    ClaudeAgentOptions,
    PermissionResultAllow,
    PermissionResultDeny,
    ResultMessage,
    ToolPermissionContext,
    query,
)

from tests.kit.fake_api import FakeMessagesAPI, Reply
from tests.kit.floor import needs_sandbox

pytestmark = needs_sandbox

ROOT = Path(__file__).resolve().parents[2]


def _warren_cli(tmp_path: Path) -> Path:
    """An executable for `cli_path` (the SDK runs it with Claude Code's flags)."""
    cli = tmp_path / "warren-cli"
    cli.write_text(f'#!/bin/sh\nexec {sys.executable} -m orchestrator.cli "$@"\n')
    cli.chmod(cli.stat().st_mode | stat.S_IXUSR)
    return cli


def _env(tmp_path: Path, api: FakeMessagesAPI) -> dict[str, str]:
    return {
        "ANTHROPIC_BASE_URL": api.base_url,
        "ANTHROPIC_API_KEY": "sk-test-sdk",
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "PYTHONPATH": str(ROOT),
    }


async def test_the_agent_sdk_drives_warren_allowing_the_edit_and_denying_the_write(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("old line\n")
    asked: list[tuple[str, dict[str, Any], str | None]] = []

    async def can_use_tool(
        name: str, input: dict[str, Any], context: ToolPermissionContext
    ) -> PermissionResultAllow | PermissionResultDeny:
        asked.append((name, input, context.tool_use_id))
        if name == "Edit":
            return PermissionResultAllow()
        return PermissionResultDeny(message="No new files in this repository.")

    replies = [
        Reply.tool_use("Read", {"file_path": str(ws / "a.txt")}),
        Reply.tool_use(
            "Edit",
            {"file_path": str(ws / "a.txt"), "old_string": "old", "new_string": "new"},
        ),
        Reply.tool_use("Write", {"file_path": str(ws / "b.txt"), "content": "b\n"}),
        Reply.text("Edited a.txt; b.txt was refused."),
    ]
    messages: list[Any] = []
    with FakeMessagesAPI(replies) as api:
        options = ClaudeAgentOptions(
            cli_path=_warren_cli(tmp_path),
            cwd=ws,
            env=_env(tmp_path, api),
            can_use_tool=can_use_tool,
        )
        async for message in query(prompt="edit a.txt, then add b.txt", options=options):
            messages.append(message)
        sent = api.requests

    assert (ws / "a.txt").read_text() == "new line\n", "the allowed Edit was applied"
    assert not (ws / "b.txt").exists(), "the denied Write was not made"
    assert [name for name, _, _ in asked] == ["Edit", "Write"], "Read needs no ask"
    assert all(tool_use_id for _, _, tool_use_id in asked)
    [result] = [m for m in messages if isinstance(m, ResultMessage)]
    assert result.subtype == "success" and not result.is_error
    assert result.result == "Edited a.txt; b.txt was refused."
    assert result.num_turns == 4 and result.session_id
    [denial] = result.permission_denials or []
    assert denial["tool_name"] == "Write" and denial["tool_input"]["file_path"] == str(
        ws / "b.txt"
    )
    write_result = sent[3].messages[-1]["content"][0]
    assert write_result["is_error"] and "No new files in this repository." in str(write_result)


async def test_a_hosts_rewritten_input_cannot_pass_a_deny_rule(tmp_path: Path) -> None:
    """The host allows the Write but rewrites its path onto a file a deny rule protects: the
    policy decides the rewritten call again, and the file is not written."""
    ws = tmp_path / "ws"
    (ws / ".warren").mkdir(parents=True)
    (tmp_path / "config" / "warren").mkdir(parents=True)
    (tmp_path / "config" / "warren" / "policy.toml").write_text(
        '[permissions]\ndeny = ["Write(secret.txt)"]\n'
    )

    async def can_use_tool(
        name: str, input: dict[str, Any], context: ToolPermissionContext
    ) -> PermissionResultAllow | PermissionResultDeny:
        return PermissionResultAllow(updated_input={**input, "file_path": str(ws / "secret.txt")})

    replies = [
        Reply.tool_use("Write", {"file_path": str(ws / "ok.txt"), "content": "x\n"}),
        Reply.text("done"),
    ]
    with FakeMessagesAPI(replies) as api:
        options = ClaudeAgentOptions(
            cli_path=_warren_cli(tmp_path), cwd=ws, env=_env(tmp_path, api),
            can_use_tool=can_use_tool,
        )  # fmt: skip
        results = [m async for m in query(prompt="write", options=options)]
        sent = api.requests
    assert not (ws / "secret.txt").exists() and not (ws / "ok.txt").exists()
    assert isinstance(results[-1], ResultMessage) and results[-1].result == "done"
    assert sent[1].messages[-1]["content"][0]["is_error"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--input-format", "stream-json"], "needs --output-format stream-json"),
        (["--permission-prompt-tool", "mcp__x__ask", "-p", "hi"], "only over stdio"),
        (["--permission-prompt-tool", "stdio", "-p", "hi"], "needs --input-format stream-json"),
    ],
)
def test_sdk_flags_that_cannot_work_are_errors_that_name_them(
    args: list[str], said: str, tmp_path: Path
) -> None:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr
