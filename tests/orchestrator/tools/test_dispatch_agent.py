"""The dispatch_agent tool over an in-process fake runner (the pool has its own tests), and the
agent types it offers: definitions on disk, trust, and the stream-json records of subagents."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pydantic
import pytest
import trio

from orchestrator.agents.dispatch_agent import DispatchAgentTool, sidechain_path
from orchestrator.agents.types import (
    GENERAL,
    AgentType,
    SubagentEvent,
    SubagentFinished,
    SubagentOutcome,
    SubagentPermission,
    SubagentReason,
    SubagentRequest,
    SubagentStarted,
    SubagentUpdate,
    load_agent_types,
    parse_agent_file,
)
from orchestrator.calls.permissions import Allow, Ask, Deny, default_permission, headless_asker
from orchestrator.claude_code.output import subagent_record, task_record
from orchestrator.errors import ConfigError
from orchestrator.events import (
    AssistantTurn,
    Event,
    RetryScheduled,
    ToolResultsMessage,
    ToolStarted,
)
from orchestrator.messages import AssistantMessage, Message, TextBlock, ToolResultBlock, Usage
from orchestrator.records.transcripts import SessionStore
from orchestrator.tools.base import Tool, ToolContext, ToolInput
from orchestrator.tools.registry import ToolRegistry, builtin_tools
from tests.orchestrator.tools.conftest import run_tool

WRITER = AgentType(
    name="writer",
    description="Edits files.",
    system_prompt="You edit.",
    tools=("Read", "Edit"),
    writable=True,
    max_turns=7,
)
TURN = AssistantMessage(
    message=Message(role="assistant", content=[TextBlock(text="found it")]),
    model="m",
    usage=Usage(input_tokens=3, output_tokens=2),
)


class FakeRunner:
    """Reports `events`, asks permission for `calls`, then returns `outcome`."""

    def __init__(
        self,
        *,
        reason: SubagentReason = "completed",
        result: str = "The answer is 42.",
        events: tuple[Event, ...] = (AssistantTurn(TURN),),
        calls: tuple[tuple[str, dict[str, Any]], ...] = (),
    ) -> None:
        self.reason: SubagentReason = reason
        self.result = result
        self.events = events
        self.calls = calls
        self.requests: list[SubagentRequest] = []
        self.decisions: list[Allow | Deny] = []

    async def run(
        self,
        request: SubagentRequest,
        *,
        on_event: Callable[[SubagentEvent], None],
        permission: SubagentPermission,
    ) -> SubagentOutcome:
        self.requests.append(request)
        for event in self.events:
            on_event(SubagentEvent(request.agent_id, event))
        decisions: dict[int, Allow | Deny] = {}

        async def decide(index: int, tool: str, input: dict[str, Any]) -> None:
            decisions[index] = await permission(tool, input)

        async with trio.open_nursery() as nursery:  # concurrently, as parallel tool calls
            for index, (tool, input) in enumerate(self.calls):
                nursery.start_soon(decide, index, tool, input)
        self.decisions = [decisions[i] for i in range(len(self.calls))]
        return SubagentOutcome(
            request.agent_id,
            self.reason,
            self.result,
            num_turns=3,
            usage=Usage(input_tokens=1200, output_tokens=340),
            cost_usd=0.0123,
            duration_s=4.2,
        )


def dispatcher(
    runner: FakeRunner,
    *,
    sidechains: Path | None = None,
    updates: list[SubagentUpdate] | None = None,
    asker: Any = headless_asker,
) -> DispatchAgentTool:
    return DispatchAgentTool(
        runner=runner,
        agent_types={"general": GENERAL, "writer": WRITER},
        tools=builtin_tools(),
        permission=default_permission(),
        asker=asker,
        sidechain_root=sidechains,
        on_update=None if updates is None else updates.append,
    )


class WarmingRunner(FakeRunner):
    """A runner that can keep a writer warm (`WarmsWriters`), counting the requests."""

    def __init__(self) -> None:
        super().__init__()
        self.expected = 0

    def expect_writers(self) -> None:
        self.expected += 1


def test_only_a_session_with_a_writable_type_has_a_writer_kept_warm() -> None:
    runner = WarmingRunner()
    for types in ({"general": GENERAL}, {"general": GENERAL, "writer": WRITER}):
        DispatchAgentTool(
            runner=runner,
            agent_types=types,
            tools=builtin_tools(),
            permission=default_permission(),
            asker=headless_asker,
        )
    assert runner.expected == 1


def test_contract_and_per_type_concurrency() -> None:
    tool = dispatcher(FakeRunner())
    assert tool.name == "dispatch_agent"
    general = tool.parse_input({"description": "survey", "prompt": "look"})
    writer = tool.parse_input({"description": "fix", "prompt": "edit", "subagent_type": "writer"})
    unknown = tool.parse_input({"description": "x", "prompt": "y", "subagent_type": "nope"})
    assert general.subagent_type == "general"
    assert tool.is_read_only(general) and tool.is_concurrency_safe(general)
    assert not tool.is_read_only(writer) and not tool.is_concurrency_safe(writer)
    assert tool.is_concurrency_safe(unknown)  # refused by validate, it does nothing
    with pytest.raises(pydantic.ValidationError):
        tool.parse_input({"description": "x", "prompt": "y", "extra": 1})
    for field, spec in tool.input_schema()["properties"].items():
        assert spec.get("description"), field
    assert "- general: A read-only explorer" in tool.description
    assert "- writer: Edits files. (tools: Read, Edit; may write files)" in tool.description
    assert tool.render_use(writer) == "dispatch_agent(writer: fix)"
    (spec,) = ToolRegistry([tool]).specs()  # what the model is told: this session's types
    assert spec.description == tool.description


async def test_an_unknown_type_is_refused_with_the_types_available(ctx: ToolContext) -> None:
    out = await run_tool(
        dispatcher(FakeRunner()), {"description": "x", "prompt": "y", "subagent_type": "ghost"}, ctx
    )
    assert out.stage == "refused"
    assert "no agent type 'ghost'. Available types: general, writer." in out.text


async def test_the_result_is_the_final_text_and_usage(ctx: ToolContext) -> None:
    runner = FakeRunner()
    updates: list[SubagentUpdate] = []
    out = await run_tool(
        dispatcher(runner, updates=updates), {"description": "find", "prompt": "Find X."}, ctx
    )
    assert out.stage == "ok" and out.output is not None and not out.output.is_error
    (request,) = runner.requests
    assert out.text.startswith("The answer is 42.\n\n[agent-")
    assert (
        f"[{request.agent_id} (general): completed, 3 turns, 4.2 s; tokens: 1200 in, 340 out, "
        "0 cache read; cost $0.0123]"
    ) in out.text
    assert request.prompt == "Find X." and request.agent_type is GENERAL
    assert str(ctx.workspace) in request.system[1] and "read-only" in request.system[1]
    assert [type(u).__name__ for u in updates] == [
        "SubagentStarted",
        "SubagentEvent",
        "SubagentFinished",
    ]
    assert {getattr(u, "agent_id", request.agent_id) for u in updates} == {request.agent_id}


@pytest.mark.parametrize(
    ("reason", "says"),
    [
        ("max_turns", "stopped at its limit of 50 turns before it finished"),
        ("model_error", "model request failed, so it stopped"),
        ("budget_exceeded", "Do not dispatch more agents"),
        ("interrupted", "was interrupted before it finished"),
        ("worker_crashed", "did not finish. The result text. Its work so far is lost"),
        ("worker_limit", "did not finish"),
        ("worker_unavailable", "did not finish"),
    ],
)
async def test_a_subagent_that_did_not_complete_is_an_error_result(
    ctx: ToolContext, reason: SubagentReason, says: str
) -> None:
    runner = FakeRunner(reason=reason, result="The result text.")
    out = await run_tool(dispatcher(runner), {"description": "d", "prompt": "p"}, ctx)
    assert out.output is not None and out.output.is_error
    assert says in out.text
    assert f": {reason}, 3 turns" in out.text


async def test_the_subagent_transcript_is_a_sidechain_next_to_the_session(
    ctx: ToolContext, tmp_path: Path
) -> None:
    sessions = tmp_path / "sessions"
    results = Message(role="user", content=[ToolResultBlock(tool_use_id="t1", content="listing")])
    runner = FakeRunner(
        events=(
            AssistantTurn(TURN),
            ToolStarted("t1", "LS", "LS(/)"),
            RetryScheduled(2, 1.0, "overloaded", 529),
            ToolResultsMessage(results),
        )
    )
    await run_tool(
        dispatcher(runner, sidechains=sessions), {"description": "d", "prompt": "p"}, ctx
    )
    agent_id = runner.requests[0].agent_id
    path = sidechain_path(sessions, ctx.session_id, agent_id)
    assert path == sessions / f"{ctx.session_id}.agents" / f"{agent_id}.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["type"] for line in lines] == [
        "subagent",
        "message",
        "message",
        "retry",
        "message",
        "result",
    ]
    assert lines[0]["agent_type"] == "general" and lines[-1]["reason"] == "completed"
    messages = [line["message"] for line in lines if line["type"] == "message"]
    assert [(m["role"], m["content"][0].get("text")) for m in messages] == [
        ("user", "p"),
        ("assistant", "found it"),
        ("user", None),
    ]
    # The sidechain reads back like any session.
    assert SessionStore(path.parent).load(agent_id).messages[0].text() == "p"


async def test_subagent_calls_are_decided_by_the_session_permission_function(
    ctx: ToolContext,
) -> None:
    edit = {"file_path": "/f", "old_string": "a", "new_string": "b"}
    runner = FakeRunner(
        calls=(
            ("Read", {"file_path": "/etc/hostname"}),
            ("Edit", edit),  # not a tool of `general`
            ("Read", {"nope": 1}),
            # `general`'s, decided as the main agent's: this session's Bash has no read-only
            # classifier, so every command is asked about, which headless is a denial.
            ("Bash", {"command": "ls"}),
        )
    )
    await run_tool(dispatcher(runner), {"description": "d", "prompt": "p"}, ctx)
    allowed, not_its_tool, invalid, asked = runner.decisions
    assert allowed == Allow(rule="read-only")
    assert isinstance(not_its_tool, Deny) and "Edit is not one of the tools" in not_its_tool.message
    assert isinstance(invalid, Deny) and "invalid" in invalid.message
    assert isinstance(asked, Deny) and "this is a non-interactive run" in asked.message


async def test_headless_asks_of_a_subagent_become_denies_its_model_sees(
    ctx: ToolContext,
) -> None:
    edit = {"file_path": "/f", "old_string": "a", "new_string": "b"}
    runner = FakeRunner(calls=(("Edit", edit),))
    writer = {"description": "d", "prompt": "p", "subagent_type": "writer"}
    await run_tool(dispatcher(runner), writer, ctx)
    (denied,) = runner.decisions
    assert isinstance(denied, Deny) and "this is a non-interactive run" in denied.message


async def test_asks_of_parallel_subagents_are_answered_one_at_a_time(ctx: ToolContext) -> None:
    asking = 0
    most = 0

    async def slow_asker(tool: Tool[Any], input: ToolInput, ask: Ask) -> Allow | Deny:
        nonlocal asking, most
        asking += 1
        most = max(most, asking)
        await trio.sleep(0.01)
        asking -= 1
        return Deny("the user said no")

    runner = FakeRunner(calls=tuple(("Edit", {"file_path": f"/f{i}", "old_string": "a",
                                              "new_string": "b"}) for i in range(3)))  # fmt: skip
    out = await run_tool(
        dispatcher(runner, asker=slow_asker),
        {"description": "d", "prompt": "p", "subagent_type": "writer"},
        ctx,
    )
    assert out.stage == "ok"
    assert runner.decisions == [Deny("the user said no")] * 3
    assert most == 1


# --- agent types ------------------------------------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_definition_file_becomes_an_agent_type(tmp_path: Path) -> None:
    path = write(
        tmp_path / "reviewer.md",
        "---\ndescription: Reviews diffs.\ntools: Read, Grep ,Glob\nmodel: claude-haiku-4-5\n"
        "max_turns: 12\ncolor: blue\n---\n\nYou review.\n\nCarefully.\n",
    )
    agent = parse_agent_file(path, "user")
    assert agent == AgentType(
        name="reviewer",
        description="Reviews diffs.",
        system_prompt="You review.\n\nCarefully.",
        tools=("Read", "Grep", "Glob"),
        model="claude-haiku-4-5",
        max_turns=12,
        source="user",
        path=path,
    )
    assert not agent.leaves_state and not agent.writable
    listed = parse_agent_file(
        write(tmp_path / "x.md", "---\nname: fixer\ndescription: d\ntools: [Read, Bash]\n"
              "writable: true\n---\nFix.\n"), "project"
    )  # fmt: skip
    assert (listed.name, listed.tools, listed.writable) == ("fixer", ("Read", "Bash"), True)
    assert listed.leaves_state


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("no front matter\n", "starts with YAML front matter"),
        ("---\ndescription: [unclosed\n---\nx\n", "not valid YAML"),
        ("---\n- a list\n---\nx\n", "must be a mapping"),
        ("---\ndescription: d\nwriteable: true\n---\nx\n", "writeable: Extra inputs"),
        ("---\nname: two words\ndescription: d\n---\nx\n", "must be one word"),
        ("---\nname: ok\n---\nx\n", "description: Field required"),
        ("---\ndescription: d\nmax_turns: 0\n---\nx\n", "max_turns: Input should be greater"),
    ],
)
def test_a_bad_definition_names_its_file(tmp_path: Path, text: str, says: str) -> None:
    path = write(tmp_path / "bad.md", text)
    with pytest.raises(ConfigError) as failed:
        parse_agent_file(path, "user")
    assert says in str(failed.value)
    assert failed.value.source == str(path)


def test_types_come_from_the_user_and_a_trusted_project(tmp_path: Path) -> None:
    config, workspace = tmp_path / "config", tmp_path / "repo"
    write(config / "agents" / "reviewer.md", "---\ndescription: user's\n---\nu\n")
    write(config / "agents" / "notes.txt", "not a definition")
    write(workspace / ".warren" / "agents" / "reviewer.md", "---\ndescription: project's\n---\np\n")
    write(workspace / ".warren" / "agents" / "general.md", "---\ndescription: mine\n---\ng\n")

    untrusted = load_agent_types(workspace, trusted=False, config_dir=config)
    assert list(untrusted) == ["general", "reviewer"]
    assert untrusted["reviewer"].description == "user's" and untrusted["general"] is GENERAL

    trusted = load_agent_types(workspace, trusted=True, config_dir=config)
    assert trusted["reviewer"].description == "project's"
    assert trusted["general"].source == "project"
    assert load_agent_types(tmp_path / "none", trusted=True, config_dir=tmp_path) == {
        "general": GENERAL
    }


def test_a_definition_naming_an_unknown_tool_is_refused(tmp_path: Path) -> None:
    write(tmp_path / "agents" / "a.md", "---\ndescription: d\ntools: Read, Teleport\n---\nx\n")
    with pytest.raises(ConfigError, match="no tool named Teleport"):
        load_agent_types(
            tmp_path, trusted=False, config_dir=tmp_path, known_tools=builtin_tools().names()
        )


def test_a_type_names_mcp_tools_one_by_one_or_by_server(tmp_path: Path) -> None:
    """MCP tools may be listed before their servers are up, so they are not checked against
    the known tools; `mcp__git` names every tool of the server `git`, and nothing else."""
    write(
        tmp_path / "agents" / "a.md",
        "---\ndescription: d\ntools: Read, mcp__git, mcp__time__get_current_time\n---\nx\n",
    )
    agent = load_agent_types(
        tmp_path, trusted=False, config_dir=tmp_path, known_tools=builtin_tools().names()
    )["a"]
    allowed = ("Read", "mcp__git__git_status", "mcp__git__x", "mcp__time__get_current_time")
    assert all(agent.allows(name) for name in allowed)
    refused = ("Bash", "mcp__time__convert_time", "mcp__gitx__status", "mcp__git__")
    assert not any(agent.allows(name) for name in refused)
    assert not agent.leaves_state  # its MCP tools run in the coordinator
    assert not GENERAL.allows("mcp__git__git_status")
    with pytest.raises(pydantic.ValidationError, match="mcp__<server>__<tool>"):
        AgentType(name="b", description="d", system_prompt="x", tools=("mcp__",))


def test_stream_json_records_of_subagents_carry_their_id() -> None:
    """Claude Code's `parent_tool_use_id` (the dispatching call) and Warren's `agent_id`."""

    def record(update: SubagentUpdate) -> dict[str, Any] | None:
        return subagent_record(update, session_id="s1", parent_tool_use_id="toolu_1")

    started = record(SubagentStarted("agent-1", "general", "survey", Path("/t/a.jsonl"), "toolu_1"))
    assert started == {
        "type": "system",
        "subtype": "subagent_start",
        "agent_id": "agent-1",
        "parent_tool_use_id": "toolu_1",
        "agent_type": "general",
        "description": "survey",
        "transcript_path": "/t/a.jsonl",
        "session_id": "s1",
    }
    turn = record(SubagentEvent("agent-1", AssistantTurn(TURN)))
    assert turn is not None and turn["type"] == "assistant" and turn["agent_id"] == "agent-1"
    assert turn["parent_tool_use_id"] == "toolu_1"
    assert turn["message"]["content"] == [{"type": "text", "text": "found it"}]
    user = record(SubagentEvent("agent-1", ToolResultsMessage(Message.user_text("r"))))
    assert user is not None and (user["type"], user["agent_id"]) == ("user", "agent-1")
    assert user["parent_tool_use_id"] == "toolu_1"
    retry = record(SubagentEvent("agent-1", RetryScheduled(2, 1.5, "busy", 529, 9)))
    assert retry is not None and retry["subtype"] == "api_retry"
    assert (retry["attempt"], retry["max_retries"], retry["retry_delay_ms"]) == (1, 9, 1500)
    assert record(SubagentEvent("agent-1", ToolStarted("t", "Read", "Read(x)"))) is None
    done = record(SubagentFinished(SubagentOutcome("agent-1", "max_turns", "x", num_turns=4)))
    assert done is not None
    assert (done["subtype"], done["terminal_reason"], done["num_turns"]) == (
        "subagent_result",
        "max_turns",
        4,
    )
    # Claude Code's task lines: a local_agent task started, then ended with a status.
    task = task_record(
        SubagentStarted("agent-1", "general", "survey", None, "toolu_1"), session_id="s1"
    )
    assert (task["subtype"], task["task_id"], task["task_type"]) == (
        "task_started",
        "agent-1",
        "local_agent",
    )
    for reason, status in [
        ("completed", "completed"),
        ("interrupted", "stopped"),
        ("max_turns", "failed"),
    ]:
        outcome = SubagentOutcome("agent-1", reason, "x")  # type: ignore[arg-type]
        ended = task_record(
            SubagentFinished(outcome), session_id="s1", parent_tool_use_id="toolu_1"
        )
        assert (ended["subtype"], ended["status"], ended["tool_use_id"]) == (
            "task_notification",
            status,
            "toolu_1",
        )
