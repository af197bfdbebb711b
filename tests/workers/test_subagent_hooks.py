"""Subagent hooks over the wire, with real agent workers under real bwrap and the real
coordinator side (`DispatchAgentTool` over a `WorkerPool`, the session's `HookRunner`).

A tap on each worker's pipes shows what crosses them: a worker asks the coordinator's hooks
only for the events its run was told of, so a session without hooks sends no hook message
at all. PreToolUse's deny acts inside the subagent, its `ask` narrows the coordinator's
permission answer, and a worker that skips its PreToolUse hooks gets no permission. (The
hooks themselves run unsandboxed here; tests/orchestrator/test_hooks_e2e.py runs them under
the floor through the CLI.)
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from orchestrator.agents.dispatch_agent import DispatchAgentInput, DispatchAgentTool
from orchestrator.agents.hooks import AgentHooks
from orchestrator.calls.permissions import Allow, PermissionResult, headless_asker
from orchestrator.calls.plan import CallPlan, tool_assessor
from orchestrator.hooks.matchers import build_matcher
from orchestrator.hooks.runner import ConfiguredHook, HookRunner
from orchestrator.messages import ContentBlock
from orchestrator.model.base import ModelRequest
from orchestrator.tools.base import ToolContext, ToolOutput
from policies.files import Hook, HookEvent
from tests.kit.floor import needs_sandbox
from tests.workers.agent_kit import (
    FACTORY,
    FunctionModel,
    agent,
    rogue_spawner,
    text,
    tool_use,
    tools,
    turn_of,
    workspace_at,
)
from workers.broker import ModelBroker
from workers.pool import PoolOptions, open_worker_pool
from workers.toolhost_runner import HostLaunch, HostProcess, HostSpawner, SandboxedSpawner

pytestmark = needs_sandbox

PROBE = agent("probe")


@dataclass
class Tap:
    """Every line that crossed a worker's pipes, by direction."""

    to_worker: list[bytes] = field(default_factory=list)
    from_worker: list[bytes] = field(default_factory=list)

    @staticmethod
    def _messages(chunks: list[bytes]) -> list[dict[str, Any]]:
        return [json.loads(line) for line in b"".join(chunks).splitlines() if line.strip()]

    def sent(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self._messages(self.to_worker) if m.get("type") == kind]

    def received(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self._messages(self.from_worker) if m.get("type") == kind]


class _TapSend(trio.abc.SendStream):
    def __init__(self, inner: trio.abc.SendStream, into: list[bytes]) -> None:
        self._inner, self._into = inner, into

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self._into.append(bytes(data))
        await self._inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self._inner.aclose()


class _TapReceive(trio.abc.ReceiveStream):
    def __init__(self, inner: trio.abc.ReceiveStream, into: list[bytes]) -> None:
        self._inner, self._into = inner, into

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self._inner.receive_some(max_bytes)
        self._into.append(bytes(data))
        return data

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Tapped:
    """A worker process whose stdin and stdout are copied into a `Tap`."""

    def __init__(self, process: HostProcess, tap: Tap) -> None:
        assert process.stdin is not None and process.stdout is not None
        self._process = process
        self._stdin = _TapSend(process.stdin, tap.to_worker)
        self._stdout = _TapReceive(process.stdout, tap.from_worker)

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def stdin(self) -> trio.abc.SendStream:
        return self._stdin

    @property
    def stdout(self) -> trio.abc.ReceiveStream:
        return self._stdout

    @property
    def stderr(self) -> trio.abc.ReceiveStream | None:
        return self._process.stderr

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    async def wait(self) -> int:
        return await self._process.wait()

    def kill(self) -> None:
        self._process.kill()


def tapping(tap: Tap, inner: HostSpawner | None = None) -> HostSpawner:
    spawner = inner or SandboxedSpawner()

    @asynccontextmanager
    async def spawn(launch: HostLaunch) -> AsyncIterator[HostProcess]:
        async with spawner(launch) as process:
            yield _Tapped(process, tap)

    return spawn


def _hooks(ws: Path, *hooks: tuple[HookEvent, str, str | None]) -> HookRunner:
    configured = [
        ConfiguredHook(Hook(event=event, command=command, matcher=matcher), "t.toml",
                       build_matcher(matcher))
        for event, command, matcher in hooks
    ]  # fmt: skip
    return HookRunner(configured, workspace=ws)


async def _allow(plan: CallPlan, ctx: ToolContext) -> PermissionResult:
    return Allow(rule="test: allow")


async def _probe_then_report(request: ModelRequest) -> Sequence[ContentBlock]:
    if turn_of(request) == 1:
        return tool_use("Probe", {"label": "x"})
    return text("report: " + request.messages[-1].tool_results()[0].text())


async def _dispatch(
    ws: Path, hooks: HookRunner | None, spawner: HostSpawner
) -> tuple[ToolOutput, FunctionModel]:
    model = FunctionModel(_probe_then_report)
    async with open_worker_pool(
        broker=ModelBroker(model),
        workspace=ws,
        spawner=spawner,
        options=PoolOptions(max_workers=1, start="lazy"),
        tools=FACTORY,
    ) as pool:
        tool = DispatchAgentTool(
            runner=pool,
            agent_types={"probe": PROBE},
            tools=tools("read_only"),
            permission=_allow,
            asker=headless_asker,
            hooks=hooks,
        )
        ctx = ToolContext(workspace=ws, cwd=ws, session_id="s1")
        input = DispatchAgentInput(description="probe", prompt="go", subagent_type="probe")
        outputs = [o async for o in tool.call(input, ctx) if isinstance(o, ToolOutput)]
    return outputs[-1], model


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return workspace_at(tmp_path)


async def test_a_pre_tool_use_hook_is_asked_over_the_wire_and_denies_inside_the_subagent(
    ws: Path,
) -> None:
    tap = Tap()
    hooks = _hooks(ws, ("PreToolUse", "echo 'no probing' >&2; exit 2", "Probe"))
    out, model = await _dispatch(ws, hooks, tapping(tap))
    assert "report: " in str(out.content) and "no probing" in str(out.content)
    result = model.requests[1].messages[-1].tool_results()[0]
    assert result.is_error and "no probing" in result.text()
    (run,) = tap.sent("run_agent")
    assert run["hook_events"] == ["PreToolUse"]
    asks = tap.received("hook_ask")
    assert [(a["event"], a["tool"], a["input"]) for a in asks] == [
        ("PreToolUse", "Probe", {"label": "x"})
    ]


async def test_without_hooks_no_hook_message_crosses_the_wire(ws: Path) -> None:
    """No hooks, or hooks only for events a subagent does not fire (Stop, SessionStart): the
    run is told of none and the worker sends no `HookAsk`."""
    for hooks in (None, _hooks(ws, ("Stop", "exit 2", None), ("SessionStart", "echo x", None))):
        tap = Tap()
        out, _ = await _dispatch(ws, hooks, tapping(tap))
        assert not out.is_error, out.content
        assert "label=x" in str(out.content)  # the Probe ran
        (run,) = tap.sent("run_agent")
        assert run["hook_events"] == []
        assert tap.received("hook_ask") == [] and tap.sent("hook_reply") == []
        assert tap.received("permission_ask") != []  # the tap does see the run's messages


async def test_a_hook_ask_narrows_the_coordinators_allow(ws: Path) -> None:
    """PreToolUse `ask` is applied by the coordinator's permission answer: the policy's
    allow becomes an ask, which headless denies."""
    ask = json.dumps({"hookSpecificOutput": {"permissionDecision": "ask"}})
    hooks = _hooks(ws, ("PreToolUse", f"echo '{ask}'", None))
    _, model = await _dispatch(ws, hooks, tapping(Tap()))
    result = model.requests[1].messages[-1].tool_results()[0]
    assert result.is_error and "label=x" not in result.text()


async def test_a_worker_that_skips_its_pre_tool_use_hooks_gets_no_permission(ws: Path) -> None:
    hooks = _hooks(ws, ("PreToolUse", "exit 0", None))
    out, _ = await _dispatch(ws, hooks, rogue_spawner("skip-hooks"))
    assert "allow=False" in str(out.content)
    assert "PreToolUse hooks were not run" in str(out.content)
    agent_hooks = AgentHooks(
        hooks, agent_id="a", tools=tools("read_only"), assessor=tool_assessor, max_stop_blocks=5
    )
    assert agent_hooks.take_verdict("Probe", {"label": ""}) == (False, None)
