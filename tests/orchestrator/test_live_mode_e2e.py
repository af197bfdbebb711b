"""The permission mode is one live value (policies/mode.py): switched mid-session, the next
hook runs under the new mode and the audit log says it, through the real CLI.

Once through an SDK host's `set_permission_mode` (the official Claude Agent SDK driving the
real `warren`), once through the REPL's `/permissions plan` (the real `warren` in tmux). In
each, a user-level UserPromptSubmit hook tries to append to a file in the workspace and tells
the model whether it could and which mode its input named; a Read follows each prompt. Before
the switch the hook writes and its Read's audit line says `default`; after it, the hook runs in
the read-only sandbox, so its write fails, it is told `plan`, and the audit line says `plan`.
(Before the fix the hook runner and the audit log kept the mode they got at start-up.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from claude_agent_sdk import ClaudeAgentOptions, ClaudeSDKClient, ResultMessage

from tests.kit.fake_api import FakeMessagesAPI, RecordedRequest, Reply
from tests.kit.floor import needs_sandbox
from tests.kit.tty import Terminal
from tests.orchestrator.test_repl_e2e import PROMPT, WARREN
from tests.orchestrator.test_repl_e2e import _env as _repl_env
from tests.orchestrator.test_sdk_control import _env as _sdk_env
from tests.orchestrator.test_sdk_control import _warren_cli

pytestmark = [
    needs_sandbox,
    # The SDK's receive_response returns at the result and leaves its inner generator to the
    # garbage collector (claude_agent_sdk/client.py), which trio reports.
    pytest.mark.filterwarnings(
        r"ignore:Exception ignored in. <async_generator object \w+\.receive_messages"
        ":pytest.PytestUnraisableExceptionWarning"
    ),
]

HOOK = """
[[hooks]]
event = "UserPromptSubmit"
command = '''
mode=$(grep -o '"permission_mode": *"[A-Za-z]*"' | grep -o '[A-Za-z]*"$' | tr -d '"')
if echo "$mode" >> hook-wrote.txt 2>/dev/null; then echo "HOOK-WROTE in $mode"
else echo "HOOK-COULD-NOT-WRITE in $mode"; fi
'''
"""


def _workspace(tmp_path: Path) -> Path:
    (tmp_path / "config" / "warren").mkdir(parents=True)
    (tmp_path / "config" / "warren" / "policy.toml").write_text(HOOK)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a line\n")
    return ws


def _replies(ws: Path) -> list[Reply]:
    read = Reply.tool_use("Read", {"file_path": str(ws / "a.txt")})
    return [read, Reply.text("first done"), read, Reply.text("second done")]


def _audit_modes(tmp_path: Path) -> list[str]:
    (audit,) = (tmp_path / "state").rglob("*.audit.jsonl")
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    return [line["mode"] for line in lines if line["kind"] == "permission"]


def _prompt_text(request: RecordedRequest) -> str:
    """The text of the last user message that carries a prompt (the hook's output is added
    to it as context)."""
    prompts = [m for m in request.messages if m["role"] == "user" and "HOOK" in json.dumps(m)]
    return json.dumps(prompts[-1]) if prompts else ""


def _check(tmp_path: Path, ws: Path, sent: list[RecordedRequest]) -> None:
    assert "HOOK-WROTE in default" in _prompt_text(sent[0])
    assert "HOOK-COULD-NOT-WRITE in plan" in _prompt_text(sent[2]), _prompt_text(sent[2])
    assert (ws / "hook-wrote.txt").read_text() == "default\n", "the hook after the switch wrote"
    assert _audit_modes(tmp_path) == ["default", "plan"]


async def test_set_permission_mode_from_the_sdk_reaches_hooks_and_the_audit_log(
    tmp_path: Path,
) -> None:
    ws = _workspace(tmp_path)
    results: list[Any] = []
    with FakeMessagesAPI(_replies(ws)) as api:
        options = ClaudeAgentOptions(
            cli_path=_warren_cli(tmp_path), cwd=ws, env=_sdk_env(tmp_path, api)
        )
        async with ClaudeSDKClient(options) as client:
            await client.query("the first")
            results += [m async for m in client.receive_response() if isinstance(m, ResultMessage)]
            await client.set_permission_mode("plan")
            await client.query("the second")
            results += [m async for m in client.receive_response() if isinstance(m, ResultMessage)]
        sent = api.requests
    assert [r.result for r in results] == ["first done", "second done"]
    _check(tmp_path, ws, sent)


def test_permissions_plan_in_the_repl_reaches_hooks_and_the_audit_log(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    with FakeMessagesAPI(_replies(ws)) as api:
        terminal = Terminal.start(
            WARREN, env=_repl_env(tmp_path, api), cwd=ws, socket_dir=tmp_path
        )
        try:
            terminal.wait_for(r"/help for commands", timeout=60)
            terminal.wait_for(PROMPT, timeout=60)
            for text, expected in (
                ("the first", r"first done"),
                ("/permissions plan", r"Mode for this session: plan"),
                ("the second", r"second done"),
            ):
                terminal.type(text)
                terminal.press("Enter")
                terminal.wait_for(expected, timeout=60)
                terminal.wait_for(PROMPT, timeout=60)
        finally:
            terminal.close()
        sent = api.requests
    _check(tmp_path, ws, sent)
