"""Warren's stream-json against Claude Code's own (issue 16, item 8).

The goldens were recorded once from Claude Code 2.1.327 (the binary claude-agent-sdk's wheel
bundles) running the scripted session of tests/kit/cc_session.py against the fake Messages API
(`record_goldens.py` beside this file). Here the real `warren` runs the same session — a
retry, a subagent, a denied Write — and every field a consumer of Claude Code's stream-json
reads must be in Warren's lines with a type Claude Code gave it. The fields are those the
official SDK's message parser reads (claude_agent_sdk/_internal/message_parser.py) and those
issue 16 names; each must be in the golden too, so the list cannot drift from Claude Code.
Then the SDK's own parser reads every Warren line, as an application built on it would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from claude_agent_sdk import AssistantMessage, ResultMessage, UserMessage
from claude_agent_sdk._internal.message_parser import parse_message

from tests.kit.cc_session import MAIN_PROMPT, kind_of, route_session, shapes
from tests.kit.fake_api import FakeMessagesAPI
from tests.kit.floor import needs_sandbox

pytestmark = needs_sandbox

ROOT = Path(__file__).resolve().parents[3]
WARREN = [sys.executable, "-m", "orchestrator.cli"]
GOLDEN = Path(__file__).resolve().parent / "goldens" / "claude-code.shape.json"

_MESSAGE = ["type", "session_id", "uuid", "parent_tool_use_id", "message", "message.role"]
_ASSISTANT = [
    *_MESSAGE,
    "message.id",
    "message.type",
    "message.model",
    "message.content",
    "message.content[].type",
    "message.usage",
    "message.usage.input_tokens",
    "message.usage.output_tokens",
]
_USER = [*_MESSAGE, "message.content", "message.content[].type", "message.content[].tool_use_id"]

CONSUMER_FIELDS: dict[str, list[str]] = {
    "system/init": [
        *("type", "subtype", "session_id", "uuid", "cwd", "model", "tools", "mcp_servers"),
        *("permissionMode", "apiKeySource", "slash_commands", "output_style"),
    ],
    "system/api_retry": [
        *("type", "subtype", "session_id", "uuid", "attempt", "max_retries"),
        *("retry_delay_ms", "error_status", "error"),
    ],
    "system/permission_denied": [
        *("type", "subtype", "session_id", "uuid", "tool_name", "tool_use_id", "message"),
    ],
    "system/task_started": [
        *("type", "subtype", "session_id", "uuid", "task_id", "description", "tool_use_id"),
        "task_type",
    ],
    "system/task_notification": [
        *("type", "subtype", "session_id", "uuid", "task_id", "status", "output_file"),
        *("summary", "tool_use_id", "usage"),
    ],
    "assistant": _ASSISTANT,
    "assistant (subagent)": [*_ASSISTANT, "agent_id"],
    "user": _USER,
    "user (subagent)": [*_USER, "agent_id"],
    "result": [
        *("type", "subtype", "is_error", "duration_ms", "duration_api_ms", "num_turns"),
        *("result", "stop_reason", "session_id", "total_cost_usd", "terminal_reason", "uuid"),
        *("usage", "usage.input_tokens", "usage.output_tokens"),
        *("usage.cache_creation_input_tokens", "usage.cache_read_input_tokens"),
        *("modelUsage", "modelUsage.*", "modelUsage.*.inputTokens", "modelUsage.*.outputTokens"),
        *("modelUsage.*.cacheReadInputTokens", "modelUsage.*.cacheCreationInputTokens"),
        "modelUsage.*.costUSD",
        *("permission_denials", "permission_denials[].tool_name"),
        *("permission_denials[].tool_use_id", "permission_denials[].tool_input"),
    ],
}


def _warren_session(tmp_path: Path) -> list[dict[str, Any]]:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("A one-line readme.\n")
    env = {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "ANTHROPIC_API_KEY": "sk-test-golden",
        "PYTHONPATH": str(ROOT),
    }
    with FakeMessagesAPI(route=route_session(ws)) as api:
        done = subprocess.run(
            [*WARREN, "-p", MAIN_PROMPT, "--cwd", str(ws), "--output-format", "stream-json"],
            env={**env, "ANTHROPIC_BASE_URL": api.base_url},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    assert done.returncode == 0, done.stderr
    assert not (ws / "notes.txt").exists(), "the denied Write was not made"
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_warren_stream_json_has_every_field_a_claude_code_consumer_reads(
    tmp_path: Path,
) -> None:
    golden = json.loads(GOLDEN.read_text())["kinds"]
    lines = _warren_session(tmp_path)
    ours = shapes(lines)
    missing = []
    for kind, fields in CONSUMER_FIELDS.items():
        assert kind in golden, f"{kind} is not in Claude Code's output"
        assert kind in ours, f"Warren wrote no {kind} line; it wrote {sorted(ours)}"
        for name in fields:
            assert name in golden[kind], f"{kind}: {name} is not in Claude Code's output"
            types = ours[kind].get(name)
            if types is None or not set(types) <= set(golden[kind][name]):
                missing.append(f"{kind}: {name} is {types}, Claude Code's {golden[kind][name]}")
    assert not missing, "\n".join(missing)

    # The session as Claude Code reports it: one retry counted from 1, the subagent's
    # messages tied to the call that started it, the denial in the result.
    [retry] = [line for line in lines if kind_of(line) == "system/api_retry"]
    assert retry["attempt"] == 1 and retry["error_status"] == 500
    dispatch = next(
        block["id"]
        for line in lines
        if kind_of(line) == "assistant"
        for block in line["message"]["content"]
        if block["type"] == "tool_use" and block["name"] == "dispatch_agent"
    )
    subagent = [line for line in lines if kind_of(line).endswith("(subagent)")]
    assert subagent and {line["parent_tool_use_id"] for line in subagent} == {dispatch}
    # Its task lines, as the Claude Agent SDK tracks a local_agent task: started, then ended.
    [started] = [line for line in lines if kind_of(line) == "system/task_started"]
    [ended] = [line for line in lines if kind_of(line) == "system/task_notification"]
    assert started["task_type"] == "local_agent" and started["tool_use_id"] == dispatch
    assert ended["task_id"] == started["task_id"] and ended["status"] == "completed"
    assert lines.index(started) < lines.index(subagent[0])
    assert lines.index(ended) > lines.index(subagent[-1])
    result = lines[-1]
    assert [d["tool_name"] for d in result["permission_denials"]] == ["Write"]
    assert len({line["uuid"] for line in lines}) == len(lines)
    assert {line["session_id"] for line in lines} == {result["session_id"]}
    # Subagents' spend is in the result: its usage counts more than the main agent's turns.
    main_turns = [line for line in lines if kind_of(line) == "assistant"]
    assert result["usage"]["output_tokens"] > sum(
        line["message"]["usage"]["output_tokens"] for line in main_turns
    )
    [model] = result["modelUsage"].values()
    assert model["requests"] == len(main_turns) + len(
        [line for line in subagent if line["type"] == "assistant"]
    )

    # A consumer built on the official SDK reads every line without a change.
    parsed = [parse_message(line) for line in lines]
    assert any(isinstance(m, AssistantMessage) and m.parent_tool_use_id for m in parsed)
    assert any(isinstance(m, UserMessage) for m in parsed)
    [final] = [m for m in parsed if isinstance(m, ResultMessage)]
    assert final.permission_denials and final.duration_api_ms >= 0 and not final.is_error
