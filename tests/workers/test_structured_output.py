"""Structured output of a subagent (orchestrator/agents/structured.py), end to end on the
coordinator's side: a `dispatch_agent` call with `output_schema` through a real `ToolPipeline`
(as Warren's own callers make it), `DispatchAgentTool` over a real `WorkerPool` whose agent
workers run under real bwrap, and a `FunctionModel` answering each subagent request by its
content. `StructuredOutput` reaches the worker as a tool the coordinator serves
(`RunAgent.mcp_tools`) and each call comes back over the wire (`McpCall`).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agents.dispatch_agent import DispatchAgentInput, DispatchAgentTool
from orchestrator.agents.dispatch_outcome import MISSING, DispatchOutcome, UntakenOutcomes
from orchestrator.agents.structured import (
    STRUCTURED_OUTPUT,
    STRUCTURED_OUTPUT_RULE,
    output_validator,
)
from orchestrator.agents.types import AgentType, SubagentEvent, SubagentUpdate
from orchestrator.calls.permissions import Allow, PermissionResult, headless_asker
from orchestrator.calls.pipeline import ToolPipeline
from orchestrator.calls.plan import CallPlan
from orchestrator.cli.wiring import _plain_process
from orchestrator.errors import ConfigError
from orchestrator.events import Event, PermissionDecided
from orchestrator.hooks.matchers import build_matcher
from orchestrator.hooks.runner import ConfiguredHook, HookRunner
from orchestrator.mcp.deferred import DeferredMcp
from orchestrator.mcp.servers import ServerProcess, open_mcp_servers
from orchestrator.messages import ContentBlock, Message, ToolResultBlock, ToolUseBlock
from orchestrator.model.base import ModelRequest
from orchestrator.tools.base import ToolContext, running_for
from orchestrator.tools.registry import ToolRegistry
from policies.files import Hook
from policies.mcp import McpServer
from tests.kit.floor import needs_sandbox
from tests.workers.agent_kit import (
    FACTORY,
    FunctionModel,
    agent,
    text,
    tool_use,
    tools,
    workspace_at,
)
from workers.broker import ModelBroker
from workers.pool import PoolOptions, open_worker_pool

pytestmark = needs_sandbox

PROBE = agent("probe")
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "answer": {"type": "integer"},
        "files": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["answer"],
    "additionalProperties": False,
}
CALL_ID = "toolu_structured_1"
CONTINUED = "You have not given a valid structured output"
"""The start of the message that continues an agent without a valid value."""


async def _allow(plan: CallPlan, ctx: ToolContext) -> PermissionResult:
    return Allow(rule="test: allow")


def _last(request: ModelRequest) -> Message:
    return request.messages[-1]


def _is_continuation(request: ModelRequest) -> bool:
    return _last(request).text().startswith(CONTINUED)


def _structured(value: dict[str, Any]) -> list[ContentBlock]:
    return tool_use(STRUCTURED_OUTPUT, value, id="toolu_so")


@dataclass
class Dispatched:
    """What one dispatch through the pipeline gave."""

    result: ToolResultBlock
    outcome: DispatchOutcome | None
    requests: list[ModelRequest]
    updates: list[SubagentUpdate] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    tool: DispatchAgentTool | None = None

    @property
    def continuations(self) -> int:
        return sum(1 for r in self.requests if _is_continuation(r))


async def _dispatch(
    ws: Path,
    respond: Any,
    *,
    schema: object = SCHEMA,
    agent_type: AgentType = PROBE,
    registry: ToolRegistry | None = None,
    hooks: HookRunner | None = None,
    write_paths: list[str] | None = None,
) -> Dispatched:
    """One `dispatch_agent` call with `output_schema`, as a workflow engine makes it: through
    a `ToolPipeline`, so the call has its tool_use_id."""
    model = FunctionModel(respond)
    updates: list[SubagentUpdate] = []
    events: list[Event] = []
    async with open_worker_pool(
        broker=ModelBroker(model),
        workspace=ws,
        options=PoolOptions(max_workers=1, start="lazy"),
        tools=FACTORY,
    ) as pool:
        tool = DispatchAgentTool(
            runner=pool,
            agent_types={agent_type.name: agent_type},
            tools=registry or tools("read_only"),
            permission=_allow,
            asker=headless_asker,
            on_update=updates.append,
            hooks=hooks,
        )
        ctx = ToolContext(workspace=ws, cwd=ws, session_id="s1")
        pipeline = ToolPipeline(
            tools=ToolRegistry([tool]),
            ctx=ctx,
            permission=_allow,
            asker=headless_asker,
            emit=events.append,
        )
        block = ToolUseBlock(
            id=CALL_ID,
            name="dispatch_agent",
            input={
                "description": "structured",
                "prompt": "Count the files.",
                "subagent_type": agent_type.name,
                "output_schema": schema,
                **({} if write_paths is None else {"write_paths": write_paths}),
            },
        )
        result = await pipeline.execute(pipeline.prepare(block))
    return Dispatched(result, tool.take_outcome(CALL_ID), model.requests, updates, events, tool)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return workspace_at(tmp_path)


async def test_an_agent_returns_a_valid_object(ws: Path) -> None:
    async def respond(request: ModelRequest) -> Sequence[ContentBlock]:
        if len(request.messages) == 1:
            return _structured({"answer": 1, "files": ["a.txt"]})
        return text("Done.")

    got = await _dispatch(ws, respond)
    assert not got.result.is_error, got.result.text()
    assert json.loads(got.result.text()) == {"answer": 1, "files": ["a.txt"]}
    first = got.requests[0]
    (spec,) = [s for s in first.tools if s.name == STRUCTURED_OUTPUT]
    assert spec.input_schema == SCHEMA  # the caller's schema is the tool's input schema
    assert "exactly once" in spec.description
    assert any(STRUCTURED_OUTPUT in block for block in first.system)
    recorded = got.requests[1].messages[-1].tool_results()[0]
    assert not recorded.is_error and "recorded" in recorded.text()
    assert len(got.requests) == 2

    # The outcome, for Warren's callers: taken once.
    outcome = got.outcome
    assert outcome is not None and outcome.failed is None
    assert outcome.has_value and outcome.value == {"answer": 1, "files": ["a.txt"]}
    assert outcome.agent_type == "probe" and outcome.agent_id.startswith("agent-")
    assert outcome.reason == "completed" and outcome.runs == 1 and outcome.text == "Done."
    assert outcome.usage.input_tokens == 20 and outcome.usage.output_tokens == 10
    assert outcome.cost_usd == pytest.approx(0.002)
    assert outcome.changes == ()
    assert got.tool is not None and got.tool.take_outcome(CALL_ID) is None

    # Allowed by the coordinator without the policy, and reported for the audit log.
    decided = [
        u.event
        for u in got.updates
        if isinstance(u, SubagentEvent)
        and isinstance(u.event, PermissionDecided)
        and u.event.tool == STRUCTURED_OUTPUT
    ]
    assert [(d.decision, d.rule) for d in decided] == [("allow", STRUCTURED_OUTPUT_RULE)]


async def test_an_invalid_first_call_is_fixed_in_the_same_run(ws: Path) -> None:
    async def respond(request: ModelRequest) -> Sequence[ContentBlock]:
        results = _last(request).tool_results()
        if not results:
            return _structured({"answer": "three", "extra": True})
        if results[0].is_error:
            return _structured({"answer": 3})
        return text("Done.")

    got = await _dispatch(ws, respond)
    assert json.loads(got.result.text()) == {"answer": 3}
    error = got.requests[1].messages[-1].tool_results()[0]
    assert error.is_error
    said = error.text()
    assert "at $.answer: 'three' is not of type 'integer'" in said
    assert "at $: Additional properties are not allowed ('extra' was unexpected)" in said
    assert len(got.requests) == 3 and got.continuations == 0
    assert got.outcome is not None and got.outcome.runs == 1 and got.outcome.value == {"answer": 3}


async def test_an_agent_that_ends_without_calling_it_is_continued_once(ws: Path) -> None:
    async def respond(request: ModelRequest) -> Sequence[ContentBlock]:
        if _is_continuation(request):
            return _structured({"answer": 7})
        if _last(request).tool_results():
            return text("Done.")
        return text("There are 7 files.")  # no StructuredOutput call: the run ends

    got = await _dispatch(ws, respond)
    assert json.loads(got.result.text()) == {"answer": 7}
    assert len(got.requests) == 3 and got.continuations == 1
    continued = got.requests[1]
    # Its conversation is kept: the first prompt, its answer, then what was wrong.
    assert [m.role for m in continued.messages] == ["user", "assistant", "user"]
    assert continued.messages[1].text() == "There are 7 files."
    assert f"it ended without calling {STRUCTURED_OUTPUT}" in _last(continued).text()
    outcome = got.outcome
    assert outcome is not None and outcome.runs == 2 and outcome.value == {"answer": 7}
    assert outcome.usage.input_tokens == 30


async def test_an_agent_that_never_gives_a_valid_value_fails_with_the_reason(ws: Path) -> None:
    async def respond(request: ModelRequest) -> Sequence[ContentBlock]:
        if _last(request).tool_results():
            return text("I cannot do better.")
        return _structured({"answer": "many"})

    got = await _dispatch(ws, respond)
    assert got.result.is_error
    said = got.result.text()
    assert said.startswith("The subagent's output did not match the schema")
    assert "continued once" in said and "at $.answer: 'many' is not of type 'integer'" in said
    # Two runs of two requests each: the one retry, and no other.
    assert len(got.requests) == 4 and got.continuations == 1
    outcome = got.outcome
    assert outcome is not None and outcome.failed == said
    assert outcome.value is MISSING and not outcome.has_value
    assert outcome.runs == 2 and outcome.reason == "completed"
    assert outcome.text == "I cannot do better."


@pytest.mark.parametrize(
    ("schema", "said"),
    [
        ({"type": "array"}, 'must describe an object at its top level ("type": "object")'),
        ({"type": "object", "properties": {"a": {"type": "nonsense"}}}, "is not a valid schema"),
        (
            {"$schema": "https://example.com/my-draft", "type": "object"},
            "is not a JSON Schema draft jsonschema knows",
        ),
    ],
)
async def test_a_bad_schema_is_refused_before_any_request(
    ws: Path, schema: object, said: str
) -> None:
    async def respond(request: ModelRequest) -> Sequence[ContentBlock]:
        raise AssertionError("no request is made")

    got = await _dispatch(ws, respond, schema=schema)
    assert got.result.is_error and said in got.result.text(), got.result.text()
    assert "nothing ran" in got.result.text()
    assert got.requests == [] and got.updates == []  # no agent started
    assert got.outcome is None  # refused before it started: the tool_result says why
    # No permission was asked either: the refusal comes first.
    assert not [e for e in got.events if isinstance(e, PermissionDecided)]


async def test_a_caller_that_skips_validation_gets_the_refusal_as_an_outcome(ws: Path) -> None:
    """`call` itself refuses a bad schema (a caller may call the tool without the pipeline),
    and the outcome says why."""
    async with open_worker_pool(
        broker=ModelBroker(FunctionModel(lambda r: _never(r))),
        workspace=ws,
        options=PoolOptions(max_workers=1, start="lazy"),
        tools=FACTORY,
    ) as pool:
        tool = DispatchAgentTool(
            runner=pool,
            agent_types={"probe": PROBE},
            tools=tools("read_only"),
            permission=_allow,
            asker=headless_asker,
        )
        ctx = ToolContext(workspace=ws, cwd=ws, session_id="s1")
        input = DispatchAgentInput(
            description="d", prompt="p", subagent_type="probe", output_schema={"type": "string"}
        )
        with running_for("toolu_direct"), pytest.raises(Exception, match="nothing ran"):
            _ = [o async for o in tool.call(input, ctx)]
        outcome = tool.take_outcome("toolu_direct")
    assert outcome is not None and outcome.runs == 0 and outcome.reason is None
    assert outcome.failed is not None and "must describe an object" in outcome.failed


async def _never(request: ModelRequest) -> Sequence[ContentBlock]:
    raise AssertionError("no request is made")


async def test_the_model_facing_schema_has_no_output_schema(tmp_path: Path) -> None:
    tool = DispatchAgentTool(
        runner=_NoRunner(),
        agent_types={"probe": PROBE},
        tools=tools("read_only"),
        permission=_allow,
        asker=headless_asker,
    )
    schema = tool.input_schema()
    assert "output_schema" not in schema["properties"]
    assert {"description", "prompt", "subagent_type"} <= set(schema["properties"])
    (spec,) = ToolRegistry([tool]).specs()
    assert "output_schema" not in json.dumps(spec.input_schema)
    assert "output_schema" not in tool.description
    # Warren's callers still set it.
    parsed = tool.parse_input({"description": "d", "prompt": "p", "output_schema": SCHEMA})
    assert parsed.output_schema == SCHEMA
    # A call with a bad input is told the parameters it may give: not this one.
    pipeline = ToolPipeline(
        tools=ToolRegistry([tool]),
        ctx=ToolContext(workspace=tmp_path, cwd=tmp_path),
        permission=_allow,
        asker=headless_asker,
        emit=lambda event: None,
    )
    block = ToolUseBlock(id="toolu_bad", name="dispatch_agent", input={"description": "d"})
    refused = await pipeline.execute(pipeline.prepare(block))
    assert refused.is_error and "Expected parameters: description, prompt" in refused.text()
    assert "output_schema" not in refused.text()


class _NoRunner:
    async def run(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("not run")


def test_output_validator_checks_the_schema_and_its_draft() -> None:
    output_validator(SCHEMA)
    output_validator({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"})
    for bad, said in [
        ({"$schema": "https://example.com/my-draft", "type": "object"}, "not a JSON Schema draft"),
        ({"type": "object", "required": "answer"}, "is not a valid schema (at $.required)"),
        ({"type": "object", "const": float("nan")}, "is not JSON"),
        (["not", "a", "schema"], "must be a JSON schema (a JSON object), not list"),
        ({"$schema": {"draft": 7}, "type": "object"}, "is not a JSON Schema draft"),
    ]:
        with pytest.raises(ConfigError) as caught:
            output_validator(bad)
        assert caught.value.source == "output_schema" and said in str(caught.value), caught.value


def test_untaken_outcomes_are_bounded() -> None:
    kept = UntakenOutcomes(limit=3)
    for i in range(5):
        kept.put(f"t{i}", DispatchOutcome(agent_id=f"a{i}", agent_type="probe", text=""))
    assert len(kept) == 3
    assert kept.take("t0") is None and kept.take("t1") is None  # the oldest were dropped
    taken = kept.take("t4")
    assert taken is not None and taken.agent_id == "a4" and not taken.has_value
    assert kept.take("t4") is None


async def test_hooks_neither_ask_for_nor_block_a_structured_output(ws: Path) -> None:
    """A PreToolUse hook that asks for every call turns the Probe's allow into an ask (denied
    headless), but StructuredOutput is allowed as it is; the hook still sees it."""
    ask = json.dumps({"hookSpecificOutput": {"permissionDecision": "ask"}})
    seen = ws.parent / "hook-inputs.jsonl"
    hook = Hook(event="PreToolUse", command=f"cat >> {seen}; echo >> {seen}; echo '{ask}'")
    hooks = HookRunner([ConfiguredHook(hook, "t.toml", build_matcher(None))], workspace=ws)

    async def respond(request: ModelRequest) -> Sequence[ContentBlock]:
        results = _last(request).tool_results()
        if len(request.messages) == 1:
            return tool_use("Probe", {"label": "x"})
        if results and results[0].tool_use_id != "toolu_so":
            assert results[0].is_error  # the Probe: asked, denied headless
            return _structured({"answer": 0})
        return text("Done.")

    got = await _dispatch(ws, respond, hooks=hooks)
    assert json.loads(got.result.text()) == {"answer": 0}, got.result.text()
    inputs = [json.loads(line) for line in seen.read_text().splitlines() if line.strip()]
    assert [(i["tool_name"], i["tool_input"]) for i in inputs] == [
        ("Probe", {"label": "x"}),
        (STRUCTURED_OUTPUT, {"answer": 0}),
    ]


BIN = Path(sys.executable).parent


@asynccontextmanager
async def _launch(name: str, server: McpServer) -> AsyncIterator[ServerProcess]:
    assert server.command is not None
    ctx = ToolContext(workspace=Path.cwd(), cwd=Path.cwd(), session_id="mcp")
    async with _plain_process((server.command, *server.args), {}, ctx) as process:
        yield process


async def test_structured_output_is_served_beside_the_agents_mcp_tools(ws: Path) -> None:
    """An agent type with an MCP tool: both are served by the coordinator through the same
    seam, each call routed by its name."""
    clock = agent("clock", tools=("Read", "mcp__time__get_current_time"))
    config = McpServer(command=str(BIN / "mcp-server-time"), args=("--local-timezone", "UTC"))
    schema = {
        "type": "object",
        "properties": {"timezone": {"type": "string"}},
        "required": ["timezone"],
    }

    async def respond(request: ModelRequest) -> Sequence[ContentBlock]:
        results = _last(request).tool_results()
        if len(request.messages) == 1:
            return tool_use("mcp__time__get_current_time", {"timezone": "UTC"}, id="toolu_t")
        if results and results[0].tool_use_id == "toolu_t":
            assert not results[0].is_error, results[0].text()
            zone = json.loads(results[0].text())["timezone"]
            return _structured({"timezone": zone})
        return text("Done.")

    async with DeferredMcp(
        lambda: open_mcp_servers({"time": (config, "test")}, _launch), ["time"]
    ).running() as servers:
        registry = ToolRegistry(list(tools("read_only")), [servers])
        got = await _dispatch(ws, respond, schema=schema, agent_type=clock, registry=registry)
    assert json.loads(got.result.text()) == {"timezone": "UTC"}, got.result.text()
    names = [s.name for s in got.requests[0].tools]
    assert "mcp__time__get_current_time" in names and STRUCTURED_OUTPUT in names


async def test_a_scoped_writers_outcome_lists_the_files_it_changed(ws: Path) -> None:
    writer = agent("writer", tools=("Write",), writable=True)
    target = ws / "out" / "new.txt"

    async def respond(request: ModelRequest) -> Sequence[ContentBlock]:
        results = _last(request).tool_results()
        if not results:
            return tool_use("Write", {"file_path": str(target), "content": "hello\n"})
        if results[0].tool_use_id != "toolu_so":
            assert not results[0].is_error, results[0].text()
            return _structured({"answer": 1, "files": [str(target)]})
        return text("Done.")

    got = await _dispatch(ws, respond, agent_type=writer, write_paths=["out"])
    assert json.loads(got.result.text()) == {"answer": 1, "files": [str(target)]}
    assert target.read_text() == "hello\n"
    outcome = got.outcome
    assert outcome is not None and outcome.failed is None
    (change,) = outcome.changes
    assert change.path == target and change.before is None
    assert change.after == hashlib.sha256(b"hello\n").hexdigest()
