"""What an SDK host adds to the session it drives (issue 16, item 7): hook callbacks, agent
types, its own MCP server and a model switch, from the official Claude Agent SDK
(`ClaudeSDKClient` with `cli_path`) spawning the real `warren`, against the fake Messages API
under the real sandbox.

One session, so one process start pays for every check: a PreToolUse callback's deny blocks
a Bash call and its message reaches the model; its allow answers the policy's ask, but never
a deny rule; a PostToolUse callback sees the calls that ran; an agent type from `agents` is
dispatched with its prompt and its model; a tool of the host's MCP server
(`create_sdk_mcp_server`) is called over the control channel and its result reaches the
model; `mcp_status` lists it connected with its tool; `set_model` switches the model the API
sees from the next request, and an unknown model is an error the SDK raises."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from claude_agent_sdk import (
    AgentDefinition,
    ClaudeAgentOptions,
    ClaudeSDKClient,
    HookContext,
    HookMatcher,
    ResultMessage,
    create_sdk_mcp_server,
    tool,
)

from tests.kit.fake_api import FakeMessagesAPI, Reply
from tests.kit.floor import needs_sandbox
from tests.orchestrator.test_sdk_control import _env, _warren_cli

pytestmark = [
    needs_sandbox,
    pytest.mark.in_process,
    # The SDK's receive_response returns at the result and leaves its inner generator to the
    # garbage collector (claude_agent_sdk/client.py), which trio reports.
    pytest.mark.filterwarnings(
        r"ignore:Exception ignored in. <async_generator object \w+\.receive_messages"
        ":pytest.PytestUnraisableExceptionWarning"
    ),
]


async def test_hook_callbacks_agents_and_set_model_from_the_sdk(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "config" / "warren").mkdir(parents=True)
    (tmp_path / "config" / "warren" / "policy.toml").write_text(
        '[permissions]\ndeny = ["Bash(touch denied.txt)"]\n'
    )
    pre: list[tuple[str, str | None]] = []
    post: list[str] = []
    added: list[dict[str, Any]] = []

    @tool("add", "Adds two numbers.", {"a": int, "b": int})
    async def add(args: dict[str, Any]) -> dict[str, Any]:
        added.append(args)
        return {"content": [{"type": "text", "text": f"sum={args['a'] + args['b']}"}]}

    async def pre_bash(
        input: Any, tool_use_id: str | None, context: HookContext
    ) -> dict[str, Any]:
        command = input["tool_input"]["command"]
        pre.append((command, tool_use_id))
        verdict = "deny" if "hooked" in command else "allow"
        return {
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": verdict,
                "permissionDecisionReason": "The host forbids hooked.txt.",
            }
        }

    async def post_any(
        input: Any, tool_use_id: str | None, context: HookContext
    ) -> dict[str, Any]:
        post.append(input["tool_name"])
        return {}

    replies = [
        Reply.tool_use("Bash", {"command": "touch hooked.txt"}),
        Reply.tool_use("Bash", {"command": "touch denied.txt"}),
        Reply.tool_use("Bash", {"command": "touch allowed.txt"}),
        Reply.tool_use(
            "dispatch_agent",
            {"description": "check", "prompt": "check a.txt", "subagent_type": "checker"},
        ),
        Reply.text("checked"),  # the checker subagent
        Reply.tool_use("mcp__calc__add", {"a": 2, "b": 3}),
        Reply.text("first done"),
        Reply.text("second done"),
    ]
    results: list[ResultMessage] = []
    with FakeMessagesAPI(replies) as api:
        options = ClaudeAgentOptions(
            cli_path=_warren_cli(tmp_path),
            cwd=ws,
            env=_env(tmp_path, api),
            hooks={
                "PreToolUse": [HookMatcher(matcher="Bash", hooks=[pre_bash])],
                "PostToolUse": [HookMatcher(hooks=[post_any])],
            },
            agents={
                "checker": AgentDefinition(
                    description="Checks a file.",
                    prompt="CHECKER-PROMPT: you check files.",
                    tools=["Read"],
                    model="haiku",
                )
            },
            mcp_servers={"calc": create_sdk_mcp_server("calc", tools=[add])},
            # MCP tools are asked about by default: the application allows its own.
            allowed_tools=["mcp__calc__add"],
        )
        async with ClaudeSDKClient(options) as client:
            await client.query("touch some files, then check")
            results += [m async for m in client.receive_response() if isinstance(m, ResultMessage)]
            status = await client.get_mcp_status()
            with pytest.raises(Exception, match="no model 'gpt-4'"):
                await client.set_model("gpt-4")
            await client.set_model("haiku")
            await client.query("again")
            results += [m async for m in client.receive_response() if isinstance(m, ResultMessage)]
        sent = api.requests

    assert [r.result for r in results] == ["first done", "second done"]
    assert not (ws / "hooked.txt").exists(), "the host's hook denied it"
    assert not (ws / "denied.txt").exists(), "the host's allow does not lift a deny rule"
    assert (ws / "allowed.txt").exists(), "the host's allow answered the policy's ask"
    assert [c for c, _ in pre] == ["touch hooked.txt", "touch denied.txt", "touch allowed.txt"]
    assert all(tool_use_id for _, tool_use_id in pre)
    assert post == ["Bash", "dispatch_agent", "mcp__calc__add"], "PostToolUse: the calls run"
    hooked = sent[1].messages[-1]["content"][0]
    assert hooked["is_error"] and "The host forbids hooked.txt." in str(hooked)
    assert sent[2].messages[-1]["content"][0]["is_error"]
    assert "CHECKER-PROMPT" in str(sent[4].system), "the SDK agent type was dispatched"
    assert sent[4].body["model"] == "claude-haiku-4-5", "with the model its type names"
    assert added == [{"a": 2, "b": 3}], "the host's MCP tool was called"
    [calc] = status["mcpServers"]
    assert (calc["name"], calc["status"]) == ("calc", "connected"), status
    assert [t["name"] for t in calc.get("tools", [])] == ["add"], status
    mcp_result = sent[6].messages[-1]["content"][0]
    assert not mcp_result.get("is_error") and "sum=5" in str(mcp_result)
    assert sent[6].body["model"] == sent[0].body["model"] != "claude-haiku-4-5"
    assert sent[7].body["model"] == "claude-haiku-4-5", "set_model switched the next request"
