"""dispatch_agent end to end: a `Session` (orchestrator/session/session.py) with the worker pool
wired in as the CLI will wire it, real agent workers under real bwrap, and the real Anthropic
SDK in the coordinator talking over a socket to the fake Messages API.

The fake answers by content (`route`), since concurrent subagents reach it in no fixed order:
a subagent's first turn is a Probe of its sandbox, labelled with the token at the end of its
prompt; its second turn reports that token.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
import trio

from orchestrator.agents.dispatch_agent import DispatchAgentTool
from orchestrator.agents.types import (
    GENERAL,
    AgentType,
    SubagentEvent,
    SubagentOutcome,
    SubagentPermission,
    SubagentRequest,
    SubagentUpdate,
)
from orchestrator.calls.permissions import default_permission, headless_asker
from orchestrator.calls.pipeline import INTERRUPTED_RUNNING, ToolPipeline, ToolRunner
from orchestrator.calls.policy import SessionPolicy
from orchestrator.conversation.loop import LoopConfig, RunControl, run_loop
from orchestrator.messages import Message
from orchestrator.paths import WarrenDirs
from orchestrator.session.config import SessionConfig, SessionParts
from orchestrator.session.open import open_session
from orchestrator.tools.base import ToolContext
from orchestrator.tools.registry import ToolRegistry
from tests.kit.fake_api import TEST_MODEL, FakeMessagesAPI, FakeResponse, RecordedRequest, Reply
from tests.kit.floor import needs_sandbox
from tests.workers.agent_kit import (
    FACTORY,
    SECRET,
    agent,
    allow_all,
    descendants,
    tools,
    workspace_at,
)
from tests.workers.agent_kit import request as subagent_request
from workers.broker import ModelBroker
from workers.pool import PoolOptions, WorkerPool, open_worker_pool
from workers.toolhost_runner import open_tool_runner

pytestmark = needs_sandbox

PROBE = agent("probe")
TOKENS = ("ALPHA", "BRAVO", "CHARLIE")


def dispatches(count: int, subagent_type: str, prompt: str) -> Reply:
    return Reply(
        content=[
            {
                "type": "tool_use",
                "id": f"toolu_dispatch_{i}",
                "name": "dispatch_agent",
                "input": {
                    "description": f"survey part {i}",
                    "prompt": f"{prompt} {TOKENS[i] if i < len(TOKENS) else i}",
                    "subagent_type": subagent_type,
                },
            }
            for i in range(count)
        ]
    )


def first_text(request: RecordedRequest) -> str:
    content = request.messages[0]["content"]
    return content if isinstance(content, str) else "".join(b.get("text", "") for b in content)


def is_subagent(request: RecordedRequest) -> bool:
    return "dispatched by another agent" in json.dumps(request.system)


class RecordingRunner:
    """Passes runs to the pool and keeps their outcomes."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        self.outcomes: list[SubagentOutcome] = []

    async def run(
        self,
        request: SubagentRequest,
        *,
        on_event: Callable[[SubagentEvent], None],
        permission: SubagentPermission,
    ) -> SubagentOutcome:
        outcome = await self.pool.run(request, on_event=on_event, permission=permission)
        self.outcomes.append(outcome)
        return outcome


def dispatch_tool(
    runner: RecordingRunner, types: dict[str, AgentType], sessions: Path | None, updates: list[Any]
) -> DispatchAgentTool:
    return DispatchAgentTool(
        runner=runner,
        agent_types=types,
        tools=tools("read_write"),
        permission=default_permission(),
        asker=headless_asker,
        sidechain_root=sessions,
        on_update=updates.append,
    )


def sandboxed_runner(
    ctx: ToolContext, policy: SessionPolicy
) -> AbstractAsyncContextManager[ToolRunner]:
    return open_tool_runner()


async def release_when_in_flight(api: FakeMessagesAPI, count: int) -> None:
    """Let held subagent responses finish once `count` of them are in flight together (they
    never are if subagents run one after another: then the test times out)."""
    # The server runs in another thread and has no event to wait on: poll it.
    while sum(1 for r in api.requests if is_subagent(r) and r.ended_at is None) < count:  # noqa: ASYNC110
        await trio.sleep(0.02)
    api.release(count)


async def test_three_subagents_dispatched_in_one_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    dirs = WarrenDirs(state=tmp_path / "state", config=tmp_path / "config")
    workspace = workspace_at(tmp_path)

    def route(request: RecordedRequest) -> FakeResponse:
        if is_subagent(request):
            token = first_text(request).split()[-1]
            if len(request.messages) == 1:
                return Reply.tool_use("Probe", {"label": token}, hold_before_stop=True)
            return Reply.text(f"report {token}")
        if len(request.messages) == 1:
            return dispatches(3, "probe", "Survey your part and report the token")
        return Reply.text("All three parts are surveyed.")

    updates: list[SubagentUpdate] = []
    with FakeMessagesAPI(route=route) as api:
        from orchestrator.model.anthropic import AnthropicModel

        broker = ModelBroker(AnthropicModel(TEST_MODEL, base_url=api.base_url))
        async with open_worker_pool(
            broker=broker,
            workspace=workspace,
            tools=FACTORY,
            options=PoolOptions(max_workers=3, start="eager"),
        ) as pool:
            runner = RecordingRunner(pool)
            dispatch = dispatch_tool(runner, {"probe": PROBE}, dirs.sessions, updates)
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(release_when_in_flight, api, 3)
                    parts = SessionParts(
                        dirs=dirs,
                        stdout=io.StringIO(),
                        tools=lambda: ToolRegistry([dispatch]),
                        model=broker,
                        runner=sandboxed_runner,
                    )
                    async with open_session(SessionConfig(cwd=workspace), parts) as session:
                        result = await session.run("Survey the repository.")
        requests = api.requests

    assert result.reason == "completed"
    assert result.result == "All three parts are surveyed."
    subagent = [r for r in requests if is_subagent(r)]
    firsts = [r for r in subagent if len(r.messages) == 1]
    seconds = [r for r in subagent if len(r.messages) == 3]
    assert len(firsts) == len(seconds) == 3
    # Concurrent: the three first requests were in flight at the same time.
    assert max(r.started_at for r in firsts) < min(r.ended_at or 0 for r in firsts)
    assert api.max_in_flight() >= 3
    # Each in its own sandboxed process, none of them the coordinator.
    pids = [o.worker_pid for o in runner.outcomes]
    assert len(set(pids)) == 3 and os.getpid() not in pids
    # None could write the workspace, none saw the API key.
    probes = sorted(r.messages[-1]["content"][0]["content"] for r in seconds)
    assert probes == [
        f"label={t} write failed: Read-only file system key_seen=False" for t in TOKENS
    ]
    assert sorted(p.name for p in workspace.iterdir()) == ["a.txt"]
    # The key travelled only from the coordinator: the subagents' requests carry it too,
    # because the broker (in the coordinator) sent them.
    assert all(SECRET in r.headers.get("x-api-key", r.headers.get("authorization", ""))
               for r in requests)  # fmt: skip
    # The main agent got the three reports, in the order of its calls.
    final = [r for r in requests if not is_subagent(r)][-1]
    results = final.messages[-1]["content"]
    assert [b["tool_use_id"] for b in results] == [f"toolu_dispatch_{i}" for i in range(3)]
    texts = [b["content"] if isinstance(b["content"], str) else b["content"][0]["text"]
             for b in results]  # fmt: skip
    assert [t.split("\n")[0] for t in texts] == [f"report {t}" for t in TOKENS]
    # Each subagent left a sidechain transcript next to the session's.
    sidechains = sorted((dirs.sessions / f"{session.session_id}.agents").glob("*.jsonl"))
    assert len(sidechains) == 3
    kinds = {type(u).__name__ for u in updates}
    assert kinds == {"SubagentStarted", "SubagentEvent", "SubagentFinished"}
    assert descendants() == []


async def test_interrupting_the_main_agent_while_ten_subagents_run(tmp_path: Path) -> None:
    workspace = workspace_at(tmp_path)

    def route(request: RecordedRequest) -> FakeResponse:
        if is_subagent(request):
            if first_text(request).startswith("Wait"):
                return Reply.text("never sent", hold_before_stop=True)
            return Reply.text("quick report")
        return dispatches(10, "general", "Wait forever, then report")

    with FakeMessagesAPI(route=route) as api:
        from orchestrator.model.anthropic import AnthropicModel

        broker = ModelBroker(AnthropicModel(TEST_MODEL, api_key="sk-test", base_url=api.base_url))
        async with open_worker_pool(
            broker=broker, workspace=workspace, options=PoolOptions(max_workers=10)
        ) as pool:
            runner = RecordingRunner(pool)
            dispatch = dispatch_tool(runner, {"general": GENERAL}, None, [])
            ctx = ToolContext(workspace=workspace, cwd=workspace)
            pipeline = ToolPipeline(
                tools=ToolRegistry([dispatch]),
                ctx=ctx,
                permission=default_permission(),
                asker=headless_asker,
                emit=lambda event: None,
            )
            control = RunControl()

            async def interrupt_when_all_run() -> None:
                while sum(1 for r in api.requests if is_subagent(r)) < 10:  # noqa: ASYNC110
                    await trio.sleep(0.02)
                control.interrupt()

            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(interrupt_when_all_run)
                    result = await run_loop(
                        model=broker,
                        messages=[Message.user_text("Survey everything.")],
                        pipeline=pipeline,
                        config=LoopConfig(),
                        emit=lambda event: None,
                        control=control,
                    )
            assert result.reason == "interrupted"
            results = result.messages[-1].tool_results()
            assert len(results) == 10
            assert all(r.is_error and r.text() == INTERRUPTED_RUNNING for r in results)
            # Every worker stopped its run and stays warm; the pool goes on.
            assert pool.idle == 10
            again = await runner.run(
                SubagentRequest(
                    "agent-after",
                    GENERAL,
                    "Report quickly",
                    GENERAL.system_blocks(workspace=workspace, cwd=workspace),
                ),
                on_event=lambda event: None,
                permission=allow_all,
            )
            assert (again.reason, again.result) == ("completed", "quick report")
        await broker.aclose()  # its model's kept-alive connection
    assert descendants() == []


async def test_a_subagent_continues_a_cut_reply_and_thinks_when_the_session_does(
    tmp_path: Path,
) -> None:
    """Subagents run the same loop: a cut text is continued, and with the session's thinking
    budget their requests think and echo their thinking back (signature included)."""
    from orchestrator.conversation.continuation import CONTINUE_PROMPT

    thinking = {"type": "thinking", "thinking": "Look first.", "signature": "c2lnLXN1Yg=="}
    replies: list[FakeResponse] = [
        Reply(content=[thinking, {"type": "tool_use", "name": "Probe", "input": {"label": "p"}}]),
        Reply(content=[{"type": "text", "text": "report, first half; "}], stop_reason="max_tokens"),
        Reply.text("second half."),
    ]
    with FakeMessagesAPI(replies) as api:
        from orchestrator.model.anthropic import AnthropicModel

        model = AnthropicModel(TEST_MODEL, api_key="sk-test", base_url=api.base_url)
        async with open_worker_pool(
            broker=ModelBroker(model),
            workspace=workspace_at(tmp_path),
            tools=FACTORY,
            options=PoolOptions(max_workers=1, thinking_budget=2048),
        ) as pool:
            with trio.fail_after(60):
                outcome = await pool.run(
                    subagent_request(PROBE, "Survey"), on_event=lambda e: None, permission=allow_all
                )
        await model.aclose()  # its kept-alive connection
        requests = api.requests
    assert (outcome.reason, outcome.result) == ("completed", "report, first half; second half.")
    assert [r.body["thinking"] for r in requests] == [
        {"type": "enabled", "budget_tokens": 2048}
    ] * 3
    assert requests[1].messages[1]["content"][0] == thinking
    assert requests[2].messages[-1]["content"][0]["text"] == CONTINUE_PROMPT
