"""The agent worker spoken to line by line, in process (the protocol and the run; the sandbox and
the process are the pool's tests): brokered model requests as deltas, permission asks answered
by the coordinator, events before the result, cancellation, shutdown, malformed input."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeVar

import pydantic
import pytest
import trio
import trio.testing

from orchestrator.events import ToolStarted
from orchestrator.messages import AssistantMessage, Message, TextBlock, ToolUseBlock, Usage
from orchestrator.model.base import BlockComplete, Retry, ToolSpec
from tests.workers.agent_kit import tools, workspace_at
from workers import protocol as wire
from workers.agent_worker import AgentWorker

M = TypeVar("M", bound=pydantic.BaseModel)


class Coordinator:
    """The coordinator's end of one in-process worker."""

    def __init__(self, workspace: Path) -> None:
        self._to_worker, self._worker_in = trio.testing.memory_stream_one_way_pair()
        self._out, self._received = trio.open_memory_channel[wire.Message](math.inf)
        self.worker = AgentWorker(
            tools=tools("read_only"), workspace=workspace, cwd=workspace, send=self._take
        )

    async def _take(self, data: bytes) -> None:
        for line in data.splitlines():
            message = wire.decode_line(line)
            assert not isinstance(message, wire.ProtocolError), message
            self._out.send_nowait(message)

    async def serve(self) -> None:
        await self.worker.serve(wire.LineReader(self._worker_in))
        self._out.close()

    async def put(self, message: pydantic.BaseModel) -> None:
        await self._to_worker.send_all(wire.encode(message))

    async def put_raw(self, line: bytes) -> None:
        await self._to_worker.send_all(line)

    async def close(self) -> None:
        await self._to_worker.aclose()

    async def next(self, kind: type[M], *, seen: list[wire.Message] | None = None) -> M:
        """The next message of `kind` (others are appended to `seen`)."""
        with trio.fail_after(10):
            async for message in self._received:
                if isinstance(message, kind):
                    return message
                if seen is not None:
                    seen.append(message)
        raise AssertionError(f"the worker ended before sending a {kind.__name__}")

    async def answer(self, request: wire.ModelRequest, *blocks: Any) -> None:
        for index, block in enumerate(blocks):
            await self.put(wire.ModelEvent.of(request.id, BlockComplete(index, block)))
        done = AssistantMessage(
            message=Message(role="assistant", content=list(blocks)),
            model="m",
            usage=Usage(input_tokens=7, output_tokens=3),
        )
        await self.put(wire.ModelDone.of(request.id, done))


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    end = Coordinator(workspace_at(tmp_path))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(end.serve)
        assert (await end.next(wire.Ready)).tools[:2] == ["Read", "Glob"]
        yield end
        await end.close()


def run_agent(agent_id: str = "agent-1", tools: list[str] | None = None) -> wire.RunAgent:
    return wire.RunAgent(
        id=agent_id,
        prompt="look around",
        system=["be brief"],
        tools=tools or ["Read", "LS", "Probe"],
        model="claude-test",
        max_turns=5,
    )


async def test_a_run_borrows_the_model_and_the_permission_function(
    coordinator: Coordinator,
) -> None:
    await coordinator.put(run_agent())
    first = await coordinator.next(wire.ModelRequest)
    assert (first.agent, first.keep, first.system) == ("agent-1", 0, ["be brief"])
    assert [m.text() for m in first.messages] == ["look around"]
    assert [t.name for t in first.tools] == ["Read", "LS", "Probe"]
    await coordinator.answer(first, ToolUseBlock(id="t1", name="Probe", input={"label": "x"}))

    ask = await coordinator.next(wire.PermissionAsk)
    assert (ask.agent, ask.tool, ask.input) == ("agent-1", "Probe", {"label": "x"})
    await coordinator.put(
        wire.PermissionReply(id=ask.id, allow=True, rule="r", updated_input={"label": "y"})
    )

    events: list[wire.Message] = []
    second = await coordinator.next(wire.ModelRequest, seen=events)
    # Only what is new since the first request travels.
    assert second.keep == 1 and [m.role for m in second.messages] == ["assistant", "user"]
    (result,) = second.messages[1].tool_results()
    assert result.text().startswith("label=y ")  # the rewritten input ran
    await coordinator.answer(second, TextBlock(text="all done"))

    done = await coordinator.next(wire.AgentResult, seen=events)
    assert (done.reason, done.result, done.num_turns) == ("completed", "all done", 2)
    assert done.usage.input_tokens == 14
    kinds = [
        next(k for k in ("turn", "tool_results", "tool_started", "tool_finished", "permission")
             if getattr(e, k) is not None)
        for e in events
        if isinstance(e, wire.AgentEvent)
    ]  # fmt: skip
    assert kinds == ["turn", "permission", "tool_started", "tool_finished", "tool_results", "turn"]


async def test_a_denied_call_is_a_tool_result_for_the_subagent(coordinator: Coordinator) -> None:
    await coordinator.put(run_agent())
    first = await coordinator.next(wire.ModelRequest)
    await coordinator.answer(first, ToolUseBlock(id="t1", name="Probe", input={}))
    ask = await coordinator.next(wire.PermissionAsk)
    await coordinator.put(wire.PermissionReply(id=ask.id, allow=False, message="Not here."))
    second = await coordinator.next(wire.ModelRequest)
    (result,) = second.messages[-1].tool_results()
    assert result.is_error and "Not here." in result.text()


async def test_a_tool_call_whose_json_did_not_parse_says_so(coordinator: Coordinator) -> None:
    await coordinator.put(run_agent())
    first = await coordinator.next(wire.ModelRequest)
    broken = ToolUseBlock(id="t1", name="Read", input={}, parse_error="Expecting ',' delimiter")
    await coordinator.answer(first, broken)
    second = await coordinator.next(wire.ModelRequest)
    (result,) = second.messages[-1].tool_results()
    assert "was not valid JSON (Expecting ',' delimiter)" in result.text()


async def test_retries_and_failures_of_the_model_reach_the_loop(coordinator: Coordinator) -> None:
    await coordinator.put(run_agent())
    first = await coordinator.next(wire.ModelRequest)
    await coordinator.put(wire.ModelEvent.of(first.id, Retry(2, 1.5, "overloaded", 529)))
    await coordinator.put(
        wire.ModelFailed(id=first.id, message="Budget is used up.", reason="budget_exceeded")
    )
    events: list[wire.Message] = []
    done = await coordinator.next(wire.AgentResult, seen=events)
    assert (done.reason, done.result) == ("budget_exceeded", "Budget is used up.")
    retries = [e.retry for e in events if isinstance(e, wire.AgentEvent) and e.retry]
    assert [(r.attempt, r.status) for r in retries] == [(2, 529)]


async def test_cancel_interrupts_the_run_and_it_still_answers(coordinator: Coordinator) -> None:
    await coordinator.put(run_agent())
    await coordinator.next(wire.ModelRequest)
    await coordinator.put(wire.Cancel(id="agent-1"))
    done = await coordinator.next(wire.AgentResult)
    assert done.reason == "interrupted"
    # The worker is free for the next run.
    await coordinator.put(run_agent("agent-2"))
    again = await coordinator.next(wire.ModelRequest)
    assert again.agent == "agent-2"


async def test_shutdown_interrupts_the_run_and_writes_its_result(
    coordinator: Coordinator,
) -> None:
    await coordinator.put(run_agent())
    await coordinator.next(wire.ModelRequest)
    await coordinator.put(wire.Shutdown())
    done = await coordinator.next(wire.AgentResult)
    assert done.reason == "interrupted"


async def test_bad_input_is_answered_with_malformed(coordinator: Coordinator) -> None:
    await coordinator.put_raw(b"this is not json\n")
    assert "invalid message" in (await coordinator.next(wire.Malformed)).detail
    await coordinator.put(wire.RunTool(id="c1", tool="Read", input={}))
    assert "does not accept 'run_tool'" in (await coordinator.next(wire.Malformed)).detail
    await coordinator.put(run_agent())
    await coordinator.next(wire.ModelRequest)
    await coordinator.put(run_agent("agent-2"))
    busy = await coordinator.next(wire.Malformed)
    assert (busy.id, busy.detail) == ("agent-2", "an agent is already running")


AGENT_MESSAGES: list[wire.Message] = [
    run_agent(),
    wire.AgentEvent.of("a", ToolStarted("t1", "Read", "Read(/x)")),  # type: ignore[list-item]
    wire.AgentEvent(id="a", tool_results=Message.user_text("r")),
    wire.AgentResult(id="a", reason="max_turns", result="stopped", num_turns=3),
    wire.ModelRequest(
        id="m1",
        agent="a",
        keep=2,
        messages=[Message.user_text("hi")],
        system=["s"],
        tools=[ToolSpec("Read", "reads", {"type": "object"})],
        max_tokens=100,
    ),
    wire.ModelEvent.of("m1", BlockComplete(0, TextBlock(text="t"))),
    wire.ModelEvent.of("m1", Retry(2, 0.5, "rate limited", 429)),
    wire.ModelDone.of(
        "m1",
        AssistantMessage(
            message=Message(
                role="assistant",
                content=[ToolUseBlock(id="t", name="Read", input={}, parse_error="bad JSON")],
            ),
            model="m",
        ),
    ),
    wire.ModelFailed(id="m1", message="no", reason="prompt_too_long", status=400),
    wire.PermissionAsk(id="p1", agent="a", tool="Bash", input={"command": "ls"}),
    wire.PermissionReply(id="p1", allow=False, message="no", rule="deny Bash"),
]


@pytest.mark.parametrize("message", AGENT_MESSAGES, ids=lambda m: type(m).__name__)
def test_agent_messages_round_trip_as_one_line(message: wire.Message) -> None:
    line = wire.encode(message)
    assert line.count(b"\n") == 1
    decoded = wire.decode_line(line)
    assert not isinstance(decoded, wire.ProtocolError)
    assert wire.encode(decoded) == line
    if isinstance(message, wire.ModelDone):  # parse errors travel beside the message
        assert isinstance(decoded, wire.ModelDone)
        assert decoded.assistant_message() == message.assistant_message()
        assert decoded.assistant_message().message.tool_uses()[0].parse_error == "bad JSON"
    else:
        assert decoded == message
