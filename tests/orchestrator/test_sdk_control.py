"""The official Claude Agent SDK (claude-agent-sdk from PyPI, pinned in the dev dependencies)
drives Warren through `cli_path`, as it drives Claude Code (issue 16, item 7): the real SDK
spawns the real `warren` process, which runs the real Anthropic SDK against the fake Messages
API, under the real sandbox. The SDK's `can_use_tool` decides what Warren's policy asks about:
its allow runs the Edit, its deny keeps the Write from being made and its message reaches the
model; a rewritten input that a deny rule forbids is still denied. The protocol's other
requests are pinned in-process against `SdkControl` over a memory stream."""

from __future__ import annotations

import io
import json
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from claude_agent_sdk import (
    ClaudeAgentOptions,
    PermissionResultAllow,
    PermissionResultDeny,
    ResultMessage,
    ToolPermissionContext,
    query,
)

from orchestrator.aio import closing_iter
from orchestrator.claude_code.sdk_control import SdkControl
from orchestrator.cli.main import main
from tests.kit.fake_api import FakeMessagesAPI, Reply
from tests.kit.floor import needs_sandbox

# main() is called in this process too: never a server in between.
pytestmark = [needs_sandbox, pytest.mark.in_process]

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
    """One session: Read runs without an ask; the host allows the Edit (applied) and denies
    the Write (not made, its message is the model's tool result); then it allows a second
    Write but rewrites its path onto a file a deny rule protects: the policy decides the
    rewritten call again, and that file is not written either."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("old line\n")
    (tmp_path / "config" / "warren").mkdir(parents=True)
    (tmp_path / "config" / "warren" / "policy.toml").write_text(
        '[permissions]\ndeny = ["Write(secret.txt)"]\n'
    )
    asked: list[tuple[str, dict[str, Any], str | None]] = []

    async def can_use_tool(
        name: str, input: dict[str, Any], context: ToolPermissionContext
    ) -> PermissionResultAllow | PermissionResultDeny:
        asked.append((name, input, context.tool_use_id))
        if name == "Edit":
            return PermissionResultAllow()
        if input["file_path"].endswith("ok.txt"):
            return PermissionResultAllow(
                updated_input={**input, "file_path": str(ws / "secret.txt")}
            )
        return PermissionResultDeny(message="No new files in this repository.")

    replies = [
        Reply.tool_use("Read", {"file_path": str(ws / "a.txt")}),
        Reply.tool_use(
            "Edit",
            {"file_path": str(ws / "a.txt"), "old_string": "old", "new_string": "new"},
        ),
        Reply.tool_use("Write", {"file_path": str(ws / "b.txt"), "content": "b\n"}),
        Reply.tool_use("Write", {"file_path": str(ws / "ok.txt"), "content": "x\n"}),
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
    assert not (ws / "secret.txt").exists() and not (ws / "ok.txt").exists()
    assert [name for name, _, _ in asked] == ["Edit", "Write", "Write"], "Read needs no ask"
    assert all(tool_use_id for _, _, tool_use_id in asked)
    [result] = [m for m in messages if isinstance(m, ResultMessage)]
    assert result.subtype == "success" and not result.is_error
    assert result.result == "Edited a.txt; b.txt was refused."
    assert result.num_turns == 5 and result.session_id
    denied = result.permission_denials or []
    assert [d["tool_input"]["file_path"] for d in denied] == [str(ws / "b.txt"), str(ws / "ok.txt")]
    write_result = sent[3].messages[-1]["content"][0]
    assert write_result["is_error"] and "No new files in this repository." in str(write_result)
    assert sent[4].messages[-1]["content"][0]["is_error"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--input-format", "stream-json"], "needs --output-format stream-json"),
        (["--permission-prompt-tool", "mcp__x__ask", "-p", "hi"], "only over stdio"),
        (["--permission-prompt-tool", "stdio", "-p", "hi"], "needs --input-format stream-json"),
        (["--include-partial-messages", "-p", "hi"], "needs --output-format stream-json"),
        (
            ["--input-format", "stream-json", "--output-format", "stream-json", "-p", "hi"],
            "reads the prompts on stdin",
        ),
    ],
)
def test_sdk_flags_that_cannot_work_are_errors_that_name_them(
    args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    assert said in capsys.readouterr().err


async def test_the_protocol_answers_each_request_and_refuses_what_warren_cannot_do() -> None:
    """`SdkControl` over a memory stream: initialize, set_permission_mode in Claude Code's
    spelling, interrupt, set_model, prompts in order; initialize's hooks and agents kept for
    the session; a second initialize, a hook event Warren does not fire, an agent field it
    has no meaning for and unknown requests are errors that name them, never accepted and
    ignored; a can_use_tool answer wakes its ask."""
    out = io.StringIO()
    modes: list[str] = []
    models: list[str | None] = []
    interrupts: list[bool] = []
    control = SdkControl(
        out,
        on_interrupt=lambda: interrupts.append(True),
        set_mode=modes.append,
        set_model=models.append,
    )
    for bad, said in [
        ({"hooks": {"PostToolUseFailure": [{"hookCallbackIds": ["h"]}]}}, "PostToolUseFailure"),
        ({"hooks": {"PreToolUse": [{"onFailure": "block", "hookCallbackIds": ["h"]}]}}, "block"),
        ({"agents": {"a": {"description": "d", "prompt": "p", "skills": ["x"]}}}, "skills"),
        ({"agents": {"a": {"description": "d", "prompt": "p", "tools": ["Nope"]}}}, "Nope"),
    ]:
        with pytest.raises(ValueError, match=said):
            SdkControl(io.StringIO())._handle({"subtype": "initialize", **bad})
    hooks = {"PreToolUse": [{"matcher": "Bash|Edit", "hookCallbackIds": ["h1", "h2"]}]}
    agents = {"checker": {"description": "d", "prompt": "p", "tools": ["Read"]}}
    send, receive = trio.testing.memory_stream_one_way_pair()

    def request(n: int, body: dict[str, Any]) -> bytes:
        line = {"type": "control_request", "request_id": f"r{n}", "request": body}
        return (json.dumps(line) + "\n").encode()

    async def host() -> None:
        await send.send_all(
            request(1, {"subtype": "initialize", "hooks": hooks, "agents": agents})
            + request(2, {"subtype": "initialize", "hooks": None})
            + request(3, {"subtype": "set_permission_mode", "mode": "acceptEdits"})
            + request(4, {"subtype": "set_permission_mode", "mode": "yolo"})
            + request(5, {"subtype": "interrupt"})
            + request(6, {"subtype": "rewind_files", "user_message_id": "u"})
            + request(7, {"subtype": "set_model", "model": "haiku"})
            + b'{"type": "user", "message": {"role": "user", "content": "first"}}\n'
            + b'{"type": "user", "message": {"role": "user", "content": '
            + b'[{"type": "text", "text": "second"}]}}\n'
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(control.serve, receive)
        nursery.start_soon(host)
        async with closing_iter(control.prompts()) as prompts:
            assert [await anext(prompts), await anext(prompts)] == ["first", "second"]
        asking = trio.Event()
        answer: list[Any] = []

        async def ask() -> None:
            answer.append(await control.request({"subtype": "can_use_tool", "tool_name": "X"}))
            asking.set()

        nursery.start_soon(ask)
        await trio.testing.wait_all_tasks_blocked()
        sent = json.loads(out.getvalue().splitlines()[-1])
        assert sent["type"] == "control_request" and sent["request"]["tool_name"] == "X"
        reply = {"subtype": "success", "request_id": sent["request_id"], "response": {"ok": 1}}
        await send.send_all(
            (json.dumps({"type": "control_response", "response": reply}) + "\n").encode()
        )
        await asking.wait()
        await send.aclose()
    assert answer == [{"ok": 1}]
    responses = {
        r["response"]["request_id"]: r["response"]
        for r in map(json.loads, out.getvalue().splitlines())
        if r["type"] == "control_response"
    }
    assert responses["r1"]["subtype"] == "success"
    assert [h.hook.command for h in control.host.hooks] == [
        "SDK hook callback h1",
        "SDK hook callback h2",
    ]
    assert all(h.callback is not None and h.matcher.regex for h in control.host.hooks)
    assert control.host.agents == agents
    assert "first message" in responses["r2"]["error"]
    assert responses["r3"]["subtype"] == "success" and modes == ["accept-edits"]
    assert "no permission mode 'yolo'" in responses["r4"]["error"]
    assert responses["r5"]["subtype"] == "success" and interrupts == [True]
    assert "rewind_files" in responses["r6"]["error"]
    assert responses["r7"]["subtype"] == "success" and models == ["haiku"]
